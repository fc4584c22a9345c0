// Reference quantizers in ggml's block layouts; see quantize.h for the algorithms.
//
// The arithmetic follows ggml's reference C code operation by operation (same float order, no
// fused multiply-add: this file is compiled with -ffp-contract=off), so the blocks are the ones
// llama-quantize writes without an importance matrix.
#include "quantize/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

namespace tandem::quant {
namespace k = tandem::kernels;

namespace {

constexpr float GROUP_MAX_EPS = 1e-15f;

inline uint16_t fp16(float f) {
  return k::f32_to_f16(f);
}
inline float fp32(uint16_t h) {
  return k::f16_to_f32(h);
}

// ---- 32-element block types ----

void q4_0(const float* x, k::BlockQ4_0* y, int64_t nb) {
  constexpr int qk = k::QK4_0;
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float amax = 0, max = 0;
    for (int j = 0; j < qk; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp16(d);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[qk / 2 + j] * id;
      const uint8_t xi0 = std::min<int8_t>(15, static_cast<int8_t>(x0 + 8.5f));
      const uint8_t xi1 = std::min<int8_t>(15, static_cast<int8_t>(x1 + 8.5f));
      y[i].qs[j] = xi0 | (xi1 << 4);
    }
  }
}

void q4_1(const float* x, k::BlockQ4_1* y, int64_t nb) {
  constexpr int qk = k::QK4_1;
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < qk; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp16(d);
    y[i].m = fp16(min);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[qk / 2 + j] - min) * id;
      const uint8_t xi0 = std::min<int8_t>(15, static_cast<int8_t>(x0 + 0.5f));
      const uint8_t xi1 = std::min<int8_t>(15, static_cast<int8_t>(x1 + 0.5f));
      y[i].qs[j] = xi0 | (xi1 << 4);
    }
  }
}

void q5_0(const float* x, k::BlockQ5_0* y, int64_t nb) {
  constexpr int qk = k::QK5_0;
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float amax = 0, max = 0;
    for (int j = 0; j < qk; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[qk / 2 + j] * id;
      const uint8_t xi0 = std::min<int8_t>(31, static_cast<int8_t>(x0 + 16.5f));
      const uint8_t xi1 = std::min<int8_t>(31, static_cast<int8_t>(x1 + 16.5f));
      y[i].qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + qk / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

void q5_1(const float* x, k::BlockQ5_1* y, int64_t nb) {
  constexpr int qk = k::QK5_1;
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < qk; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp16(d);
    y[i].m = fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[qk / 2 + j] - min) * id;
      const uint8_t xi0 = static_cast<uint8_t>(x0 + 0.5f);
      const uint8_t xi1 = static_cast<uint8_t>(x1 + 0.5f);
      y[i].qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + qk / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

void q8_0(const float* x, k::BlockQ8_0* y, int64_t nb) {
  constexpr int qk = k::QK8_0;
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float amax = 0;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp16(d);
    for (int j = 0; j < qk; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

// ---- K-quants ----

void q2_k(const float* x, k::BlockQ2_K* y, int64_t nb) {
  constexpr int QK_K = k::QK_K;
  uint8_t L[QK_K], Laux[16];
  float weights[16], mins[QK_K / 16], scales[QK_K / 16];
  const float q4scale = 15.f;
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                   0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = nearest_int(iscale * scales[j]);
      y[i].d = fp16(max_scale / q4scale);
    } else {
      for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = 0;
      y[i].d = fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < QK_K / 16; ++j) {
        const int l = nearest_int(iscale * mins[j]);
        y[i].scales[j] |= (l << 4);
      }
      y[i].dmin = fp16(max_min / q4scale);
    } else {
      y[i].dmin = fp16(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = fp32(y[i].d) * (y[i].scales[j] & 0xF);
      if (!d) continue;
      const float dm = fp32(y[i].dmin) * (y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = std::clamp(l, 0, 3);
      }
    }
    for (int j = 0; j < QK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[j / 4 + l] =
            L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
      }
    }
  }
}

void q3_k(const float* x, k::BlockQ3_K* y, int64_t nb) {
  constexpr int QK_K = k::QK_K;
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, 12);
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) {
        int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<int8_t>(std::clamp<int>(l, -32, 31) + 32);
        if (j < 8) {
          y[i].scales[j] = l & 0xF;
        } else {
          y[i].scales[j - 8] |= ((l & 0xF) << 4);
        }
        l >>= 4;
        y[i].scales[j % 4 + 8] |= (l << (2 * (j / 4)));
      }
      y[i].d = fp16(1 / iscale);
    } else {
      y[i].d = fp16(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      int8_t sc = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
      sc = static_cast<int8_t>((sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
      const float d = fp32(y[i].d) * sc;
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::clamp(l, -4, 3) + 4);
      }
    }
    std::memset(y[i].hmask, 0, QK_K / 8);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; ++j) {
      if (L[j] > 3) {
        y[i].hmask[m] |= hm;
        L[j] -= 4;
      }
      if (++m == QK_K / 8) {
        m = 0;
        hm <<= 1;
      }
    }
    for (int j = 0; j < QK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[j / 4 + l] =
            L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
      }
    }
  }
}

// Shared by Q4_K and Q5_K: 8 sub-blocks of 32, 6-bit scales and mins. Fills d, dmin, scales
// and the levels L (0..nmax).
void k4_scales(const float* x, int nmax, float rmin, int nstep, uint16_t* out_d, uint16_t* out_dmin,
               uint8_t* packed, uint8_t* L) {
  constexpr int QK_K = k::QK_K;
  uint8_t Laux[32];
  float weights[32], mins[QK_K / 32], scales[QK_K / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < QK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                                 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(packed, 0, k::K_SCALE_SIZE);
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
      packed[j - 4] |= ((ls >> 4) << 6);
      packed[j - 0] |= ((lm >> 4) << 6);
    }
  }
  *out_d = fp16(max_scale / 63.f);
  *out_dmin = fp16(max_min / 63.f);
  for (int j = 0; j < QK_K / 32; ++j) {
    int sc, m;
    k::unpack_scale_min_k4(j, packed, &sc, &m);
    const float d = fp32(*out_d) * sc;
    if (!d) continue;
    const float dm = fp32(*out_dmin) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::clamp(l, 0, nmax));
    }
  }
}

void q4_k(const float* x, k::BlockQ4_K* y, int64_t nb) {
  constexpr int QK_K = k::QK_K;
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    k4_scales(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < QK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = L[j + l] | (L[j + l + 32] << 4);
      q += 32;
    }
  }
}

void q5_k(const float* x, k::BlockQ5_K* y, int64_t nb) {
  constexpr int QK_K = k::QK_K;
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    k4_scales(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* qh = y[i].qh;
    uint8_t* ql = y[i].qs;
    std::memset(qh, 0, QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 <<= 2;
      m2 <<= 2;
      ql += 32;
    }
  }
}

void q6_k(const float* x, k::BlockQ6_K* y, int64_t nb) {
  constexpr int QK_K = k::QK_K;
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, nullptr);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
      std::memset(&y[i], 0, sizeof(k::BlockQ6_K));
      y[i].d = fp16(0.f);
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = fp16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = fp32(y[i].d) * y[i].scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::clamp(l, -32, 31) + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < QK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF;
        const uint8_t q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF;
        const uint8_t q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = q1 | (q3 << 4);
        ql[l + 32] = q2 | (q4 << 4);
        qh[l] = (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                ((L[j + l + 96] >> 4) << 6);
      }
      ql += 64;
      qh += 32;
    }
  }
}

}  // namespace

int nearest_int(float fval) {
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* neg_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

float make_q3_quants(int n, int nmax, const float* x, int8_t* L, bool do_rmse) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < GROUP_MAX_EPS) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = -nmax / max;
  if (do_rmse) {
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      L[i] = static_cast<int8_t>(l);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
      int n_changed = 0;
      for (int i = 0; i < n; ++i) {
        const float w = x[i] * x[i];
        float slx = sumlx - w * x[i] * L[i];
        if (slx > 0) {
          float sl2 = suml2 - w * L[i] * L[i];
          int new_l = nearest_int(x[i] * sl2 / slx);
          new_l = std::max(-nmax, std::min(nmax - 1, new_l));
          if (new_l != L[i]) {
            slx += w * x[i] * new_l;
            sl2 += w * new_l * new_l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
              L[i] = static_cast<int8_t>(new_l);
              sumlx = slx;
              suml2 = sl2;
              ++n_changed;
            }
          }
        }
      }
      if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
    return sumlx / suml2;
  }
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
  }
  return 1 / iscale;
}

float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type, const float* qw) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < GROUP_MAX_EPS) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) {
      const int l = nearest_int(iscale * x[i]);
      L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
    }
    return 1 / iscale;
  }
  bool return_early = false;
  if (rmse_type < 0) {
    rmse_type = -rmse_type;
    return_early = true;
  }
  auto weight = [&](int i) -> float {
    if (qw) return qw[i];
    switch (rmse_type) {
      case 1:
        return x[i] * x[i];
      case 2:
        return 1;
      case 3:
        return std::fabs(x[i]);
      default:
        return std::sqrt(std::fabs(x[i]));
    }
  };
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Every weight type the engine computes with (F32, F16, BF16 and the quantized types).
bool can_quantize(TensorType type) {
  return type == TensorType::F32 || k::is_supported_weight_type(type);
}

void quantize_row(TensorType type, const float* x, void* dst, int64_t n) {
  if (!can_quantize(type)) {
    throw Error("quantize: cannot produce tensor type " + std::string(traits(type).name));
  }
  const int64_t bs = traits(type).block_size;
  if (n % bs != 0) {
    throw Error("quantize: row of " + std::to_string(n) + " values is not a multiple of the " +
                std::string(traits(type).name) + " block size " + std::to_string(bs));
  }
  const int64_t nb = n / bs;
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, x, n * sizeof(float));
      break;
    case TensorType::F16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) y[i] = k::f32_to_f16(x[i]);
      break;
    }
    case TensorType::BF16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) y[i] = k::f32_to_bf16(x[i]);
      break;
    }
    case TensorType::Q8_0:
      q8_0(x, static_cast<k::BlockQ8_0*>(dst), nb);
      break;
    case TensorType::Q4_0:
      q4_0(x, static_cast<k::BlockQ4_0*>(dst), nb);
      break;
    case TensorType::Q4_1:
      q4_1(x, static_cast<k::BlockQ4_1*>(dst), nb);
      break;
    case TensorType::Q5_0:
      q5_0(x, static_cast<k::BlockQ5_0*>(dst), nb);
      break;
    case TensorType::Q5_1:
      q5_1(x, static_cast<k::BlockQ5_1*>(dst), nb);
      break;
    case TensorType::Q2_K:
      q2_k(x, static_cast<k::BlockQ2_K*>(dst), nb);
      break;
    case TensorType::Q3_K:
      q3_k(x, static_cast<k::BlockQ3_K*>(dst), nb);
      break;
    case TensorType::Q4_K:
      q4_k(x, static_cast<k::BlockQ4_K*>(dst), nb);
      break;
    case TensorType::Q5_K:
      q5_k(x, static_cast<k::BlockQ5_K*>(dst), nb);
      break;
    case TensorType::Q6_K:
      q6_k(x, static_cast<k::BlockQ6_K*>(dst), nb);
      break;
    default:
      break;
  }
}

void quantize_rows(TensorType type, const float* x, void* dst, int64_t n_rows, int64_t n_per_row,
                   ThreadPool* pool) {
  const size_t rb = row_bytes(type, n_per_row);
  auto* out = static_cast<uint8_t*>(dst);
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      quantize_row(type, x + r * n_per_row, out + r * rb, n_per_row);
    }
  };
  if (!pool || pool->size() <= 1 || n_rows < 2) {
    body(0, n_rows);
    return;
  }
  // Validate once on the calling thread so an error is thrown here, not in a worker.
  if (!can_quantize(type) || n_per_row % traits(type).block_size != 0) {
    quantize_row(type, x, dst, n_per_row);
  }
  pool->parallel_for(n_rows, 1, body);
}

void to_f32(TensorType type, const void* src, float* dst, int64_t n) {
  if (type == TensorType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const int64_t bs = traits(type).block_size;
  if (n % bs != 0) {
    throw Error("dequantize: " + std::to_string(n) + " values is not a multiple of the " +
                std::string(traits(type).name) + " block size " + std::to_string(bs));
  }
  k::dequantize_row(type, src, dst, n);
}

}  // namespace tandem::quant
