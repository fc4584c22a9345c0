// GGUF -> GGUF re-quantization; see quantize_file.h.
#include "quantize/quantize_file.h"

#include <chrono>
#include <filesystem>
#include <memory>

#include "common/error.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "quantize/quantize.h"

namespace tandem::quant {

QuantizeReport quantize_file(const std::string& in_path, const std::string& out_path,
                             const QuantizeOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (std::filesystem::exists(out_path) && std::filesystem::exists(in_path) &&
      std::filesystem::equivalent(in_path, out_path)) {
    throw Error("quantize: output '" + out_path + "' is the input file");
  }
  auto in = GgufFile::open(in_path);
  QuantizeReport rep;
  rep.in_file_bytes = in->file_size();
  rep.plans = plan_tensor_types(*in, opt.file_type, opt.pure);

  GgufWriter w;
  w.copy_metadata(*in);
  w.set_u32("general.quantization_version", 2);
  w.set_u32("general.file_type", opt.file_type.llama_ftype);
  w.set_string("general.quantized_by", "tandem");
  w.set_string("tandem.quantize.type", opt.file_type.name);
  w.set_bool("tandem.quantize.pure", opt.pure);

  ThreadPool pool(opt.n_threads > 0 ? opt.n_threads : default_thread_count());
  std::vector<float> f32;
  size_t i = 0;
  for (const auto& p : rep.plans) {
    const auto& t = in->tensors()[p.index];
    const std::span<const int64_t> ne(t.ne, t.n_dims);
    rep.in_tensor_bytes += t.nbytes;
    rep.n_params += static_cast<uint64_t>(t.n_elements());
    size_t out_bytes = t.nbytes;
    if (!p.quantize) {
      w.add_tensor_view(t);
      ++rep.n_copied;
    } else {
      const int64_t n = t.n_elements();
      const int64_t nrows = t.n_rows();
      const int64_t ne0 = t.ne[0];
      if (ne0 % traits(p.dst_type).block_size != 0) {
        throw Error("quantize: tensor '" + t.name + "' " + t.shape_string() + ": row length " +
                    std::to_string(ne0) + " is not a multiple of the " +
                    std::string(traits(p.dst_type).name) + " block size " +
                    std::to_string(traits(p.dst_type).block_size));
      }
      f32.resize(static_cast<size_t>(n));
      const size_t src_rb = row_bytes(t.type, ne0);
      pool.parallel_for(nrows, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          to_f32(t.type, t.data + r * src_rb, f32.data() + r * ne0, ne0);
        }
      });
      std::vector<uint8_t> out(row_bytes(p.dst_type, ne0) * static_cast<size_t>(nrows));
      quantize_rows(p.dst_type, f32.data(), out.data(), nrows, ne0, &pool);
      out_bytes = out.size();
      w.add_tensor(t.name, p.dst_type, ne, out);
      ++rep.n_quantized;
    }
    if (!p.fallback.empty()) ++rep.n_fallback;
    rep.out_tensor_bytes += out_bytes;
    if (opt.on_tensor) opt.on_tensor(i, rep.plans.size(), p, t.nbytes, out_bytes);
    ++i;
  }
  w.write(out_path);
  rep.out_file_bytes = std::filesystem::file_size(out_path);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace tandem::quant
