#!/usr/bin/env python3
"""Which router features find the answers the cloud fixes: 5-fold cross-validation by sequence
over a `tandem router collect` trace (format version 2, docs/router.md), label `fixes` (the
edge's top-1 is not the true token and the cloud's is).

For each feature set it prints the recall of the positives among the top 7% and 20% of
positions by score — the share of fixable answer tokens a router would catch at that cloud
share — for the three heuristics (no training) and L2-regularised logistic regressions on the
scalar features alone and on the scalars plus the edge's final hidden state. Optionally a second
trace (e.g. WikiText-2 validation) is added to every training fold with a weight.

  pip install numpy scikit-learn
  scripts/router_features_cv.py eval-out/lambada-0-2575.trace [--extra wikitext-valid64.trace]
"""
import argparse
import struct

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

SHARES = (0.07, 0.2)
N_SCALARS = 12  # log top-8 probabilities, entropy, margin, log1p(position), index in the answer


def read_trace(path):
    """Rows of [scalars..., hidden...], the fixes label and the sequence id per row."""
    b = open(path, "rb").read()
    if b[:9] != b"TNDMTRACE":
        raise SystemExit(f"{path}: not a tandem trace")
    version, n_embd, top_k, _ = struct.unpack_from("<4I", b, 12)
    if version != 2 or top_k != 8:
        raise SystemExit(f"{path}: version {version}, top-k {top_k}; this script reads 2 and 8")
    name_len = struct.unpack_from("<I", b, 40)[0]  # after the u64 fingerprint and u32 flags
    off = 44 + name_len
    rec = 48 + 4 * top_k + 4 * n_embd
    rows, labels, groups = [], [], []
    while off < len(b):
        _, seq, count = struct.unpack_from("<IQI", b, off)
        off += 16
        for k in range(count):
            pos, edge_top1, true_tok, cloud_top1 = struct.unpack_from("<4i", b, off)
            entropy, margin = struct.unpack_from("<2f", b, off + 28)
            feats = np.frombuffer(b, dtype="<f4", count=top_k + n_embd, offset=off + 48)
            off += rec
            if true_tok < 0:
                continue
            scalars = [entropy, margin, np.log1p(pos + 1), k]
            rows.append(np.concatenate([feats[:top_k], scalars, feats[top_k:]]))
            labels.append((edge_top1 != true_tok and cloud_top1 == true_tok, edge_top1 != cloud_top1))
            groups.append(seq)
        off += 8
    labels = np.array(labels).reshape(-1, 2)
    return np.array(rows, dtype=np.float32), labels[:, 0], labels[:, 1], np.array(groups)


def recall_at(score, y, share):
    top = np.argsort(-score)[: int(round(share * len(y)))]
    return y[top].sum() / max(1, y.sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--extra", help="a second trace added to every training fold")
    ap.add_argument("--extra-weight", type=float, default=0.2)
    ap.add_argument("--C", type=float, default=0.001, help="inverse L2 strength, all features")
    ap.add_argument("--learn", choices=("fixes", "disagree"), default="fixes",
                    help="what the models are fitted to (recall is always of the fixes): the "
                         "label itself, or where the two top-1s differ")
    ap.add_argument("--mlp", type=int, default=0,
                    help="also an MLP with one hidden layer this wide (sklearn, L2 1.0, early "
                         "stopping), on all features")
    a = ap.parse_args()
    x, y, disagree, g = read_trace(a.trace)
    target = y if a.learn == "fixes" else disagree
    print(f"{a.trace}: {len(y)} positions in {len(set(g))} sequences, {100 * y.mean():.1f}% fixes")
    for name, col, sign in (("confidence", 0, -1), ("entropy", 8, 1), ("margin", 9, -1)):
        score = sign * (np.exp(x[:, 0]) if col == 0 else x[:, col])
        print(f"{name:>40}: " + "  ".join(f"{100 * s:.0f}%: {100 * recall_at(score, y, s):.1f}%"
                                          for s in SHARES))
    extra = read_trace(a.extra) if a.extra else None
    models = [("logistic, scalars", slice(0, N_SCALARS), lambda: LogisticRegression(C=1.0, max_iter=3000)),
              ("logistic, scalars + hidden", slice(None), lambda: LogisticRegression(C=a.C, max_iter=3000))]
    if a.mlp:
        models.append((f"MLP {a.mlp}, scalars + hidden", slice(None), lambda: MLPClassifier(
            (a.mlp,), alpha=1.0, max_iter=300, early_stopping=True, random_state=1)))
    for name, cols, make in models:
        got = {s: [] for s in SHARES}
        for train, test in GroupKFold(5).split(x, y, g):
            xt, yt, w = x[train][:, cols], target[train], np.ones(len(train))
            if extra is not None:
                extra_target = extra[1] if a.learn == "fixes" else extra[2]
                xt = np.vstack([xt, extra[0][:, cols]])
                yt = np.concatenate([yt, extra_target])
                w = np.concatenate([w, np.full(len(extra_target), a.extra_weight)])
            model = make_pipeline(StandardScaler(), make())
            if isinstance(model[-1], MLPClassifier):  # takes no sample weights
                model.fit(xt, yt)
            else:
                model.fit(xt, yt, **{model.steps[-1][0] + "__sample_weight": w})
            score = model.predict_proba(x[test][:, cols])[:, 1]
            for s in SHARES:
                got[s].append(recall_at(score, y[test], s))
        print(f"{name + ', learns ' + a.learn:>40}: " + "  ".join(
            f"{100 * s:.0f}%: {100 * np.mean(got[s]):.1f}%" for s in SHARES))


if __name__ == "__main__":
    main()
