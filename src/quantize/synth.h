// Random-weight GGUF files with the exact shapes of named real models, for measuring speed at
// real sizes without the real weights (`tandem synth`).
//
// Weights: seeded normal random numbers (std 0.02 for matrices and biases, 1 + N(0, 0.02^2)
// for norm gains), quantized with tandem's quantizers under the file type's mix rules (the same
// rules as `tandem quantize`, including the row-length fallbacks: gemma3-270m's n_embd 640 is not
// a multiple of 256). Deterministic for a given seed and thread count independent.
// Vocabulary: a synthetic SentencePiece vocab of n_vocab tokens (<unk>, <s>, </s>, the 256
// byte tokens <0x00>..<0xFF>, then unique pieces), or the tokenizer.* keys of another GGUF
// (vocab_from), whose token count must equal the shape's n_vocab.
#pragma once

// SynthShape, synth_shapes, SynthOptions and write_synth_model are declared in the public API
// (the CLI calls them).
#include "quantize/type_mix.h"
#include "tandem/quantize.h"
