/// @file
/// The umbrella header: every public header of graft's four layers, for programs that use the
/// library as a whole. `#include <graft/graft.h>` and link `graft::graft` (CMake) or
/// `pkg-config --cflags --libs graft`.
///
/// The layers, each with its own headers under graft/:
/// - autograd: Tensor, the tape, backward(), NoGrad, gradcheck();
/// - ops: every differentiable op (graft/ops/ops.h) and mixed precision;
/// - nn: Module, layers, attention, positional encodings, optimizers, schedules, checkpoints,
///   the training loop, the WordPiece tokenizer;
/// - models: the encoder-decoder Transformer, the decoder-only LM, the encoder classifier,
///   decoding (greedy, beam, sampling), and pretrained BERT-family encoders (bert.h,
///   sentence_encoder.h).
#pragma once

#include "graft/version.h"

#include "graft/autograd/gradcheck.h"
#include "graft/autograd/graph.h"
#include "graft/autograd/tape.h"
#include "graft/autograd/tensor.h"

#include "graft/ops/ops.h"

#include "graft/autograd/text.h"
#include "graft/nn/attention.h"
#include "graft/nn/layers.h"
#include "graft/nn/module.h"
#include "graft/nn/positions.h"
#include "graft/nn/text/bpe.h"
#include "graft/nn/text/wordpiece.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/optim.h"
#include "graft/nn/train/trainer.h"
#include "graft/nn/transformer.h"

#include "graft/models/bert.h"
#include "graft/models/config_json.h"
#include "graft/models/decoder_only_lm.h"
#include "graft/models/decoding.h"
#include "graft/models/encoder_classifier.h"
#include "graft/models/exported.h"
#include "graft/models/hf.h"
#include "graft/models/run.h"
#include "graft/models/sentence_encoder.h"
#include "graft/models/transformer.h"
