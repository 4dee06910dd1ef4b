// The programs' outputs checked for NaN and Inf: a score, a loss or an embedding that a program
// prints or writes is never NaN with exit code 0 (a model with one NaN weight once printed "nan"
// scores and exited 0). The error names the output and, where it can, the cause: the first
// parameter of the model holding NaN or Inf (a damaged or diverged weights file) and the first op
// that made or received the value, found by running the computation again under anomaly mode
// (autograd/tape.h), which checks only ops that record.
#pragma once

#include <cmath>
#include <functional>
#include <string>

#include "graft/autograd/tape.h"
#include "graft/autograd/tensor.h"
#include "graft/nn/module.h"

namespace graft::cli {

// "the model's parameter 'encoder.layers.0.linear1.weight' (f32 (8, 4)) holds NaN", for the
// first parameter of `m` that holds NaN or Inf; "" when every one is finite.
// A parameter whose values were replaced by an int8 form (no bytes left) is skipped: its form was
// refused at quantization or loading if it held NaN or Inf.
inline std::string nonfinite_parameter(const nn::Module& m) {
  for (const auto& [name, t] : m.named_parameters()) {
    if (!t.impl()->storage->data) continue;
    if (const char* kind = autograd::nonfinite_kind(t))
      return "the model's parameter '" + name + "' (" + describe(t) + ") holds " + kind;
  }
  return "";
}

// The anomaly error of `forward` run again with recording and anomaly mode on: it names the first
// op (and module) that made or received a NaN or Inf; "" when no recorded op saw one. The rerun's
// tape entries are never run backward: they are freed when the tape held nothing before it.
inline std::string first_nonfinite_op(const std::function<void()>& forward) {
  const size_t before = autograd::tape_size();
  std::string why;
  try {
    autograd::EnableGrad record;
    autograd::AnomalyMode anomaly;
    forward();
  } catch (const Error& e) {
    why = e.what();
  }
  if (before == 0) autograd::clear_tape();
  return why;
}

// Throws "<what> holds NaN: <parameter>; <anomaly error>" (the causes that were found).
[[noreturn]] inline void fail_nonfinite(const std::string& what, const char* kind,
                                        const nn::Module* model,
                                        const std::function<void()>& rerun) {
  std::string why = model ? nonfinite_parameter(*model) : "";
  const std::string op = rerun ? first_nonfinite_op(rerun) : "";
  if (!op.empty()) why += (why.empty() ? "" : "; ") + op;
  fail(what + " " + kind + (why.empty() ? std::string() : ": " + why));
}

// `t` itself, when it holds no NaN or Inf; else the error of fail_nonfinite() ("<what> holds
// NaN: ..."). `rerun`, when given, repeats the forward that made `t`.
inline const Tensor& check_finite(const std::string& what, const Tensor& t,
                                  const nn::Module* model = nullptr,
                                  const std::function<void()>& rerun = {}) {
  if (const char* kind = autograd::nonfinite_kind(t))
    fail_nonfinite(what, (std::string("holds ") + kind).c_str(), model, rerun);
  return t;
}

// A printed score or loss `v` itself, when finite; else "<what> is NaN: ..." as above.
inline double check_finite(const std::string& what, double v, const nn::Module* model = nullptr,
                           const std::function<void()>& rerun = {}) {
  if (!std::isfinite(v)) fail_nonfinite(what, std::isnan(v) ? "is NaN" : "is Inf", model, rerun);
  return v;
}

}  // namespace graft::cli
