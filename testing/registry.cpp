// The registry of op records (graft/testing/registry.h) and the helpers of the cases.
#include "graft/testing/registry.h"

#include <cmath>
#include <deque>
#include <mutex>

namespace graft {

namespace {

std::deque<OpRecord>& records() {
  static std::deque<OpRecord> r;
  return r;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

// The structural faults register_op() refuses: a name taken, a sample of another op.
void check_new_record(const OpRecord& r) {
  if (r.name.empty()) fail("register_op: a record without a name");
  for (const OpRecord& e : records()) {
    for (const OpCase& c : e.samples)
      for (const OpCase& n : r.samples)
        if (c.name == n.name) fail("register_op: duplicate case name '" + n.name + "'");
    if (e.name == r.name) fail("register_op: duplicate op record '" + r.name + "'");
  }
  for (const OpCase& c : r.samples)
    if (!c.op.empty() && c.op != r.name)
      fail("register_op: sample '" + c.name + "' of record '" + r.name + "' names op '" + c.op +
           "'");
}

}  // namespace

std::vector<std::string> missing_fields(const OpRecord& r) {
  std::vector<std::string> out;
  const std::string op = "op '" + r.name + "' ";
  const auto lacks = [&](bool missing, const char* what) {
    if (missing) out.push_back(op + what);
  };
  lacks(r.name.empty(), "has no name");
  lacks(r.family.empty(), "has no family");
  lacks(r.forward.empty(), "has no forward (the public function that records it)");
  lacks(r.backward.empty(), "has no backward (its <op>_backward function)");
  lacks(r.double_backward == DoubleBackward::undecided,
        "has no double_backward (composed, backward_op or none)");
  lacks(r.double_backward == DoubleBackward::backward_op && r.double_backward_op.empty(),
        "has a backward_op double backward but no double_backward_op");
  lacks(r.samples.empty(), "has no samples (gradcheck cases)");
  lacks(r.error_inputs.empty(), "has no error_inputs (a bad input and the error it raises)");
  lacks(r.nonfinite.kind == NonFiniteRule::undecided, "has no non-finite decision (nonfinite)");
  lacks(r.nonfinite.kind == NonFiniteRule::exception && r.nonfinite.why.empty(),
        "has a non-finite exception that does not say why");
  return out;
}

void register_op(OpRecord r) {
  std::lock_guard<std::mutex> lk(registry_mutex());
  check_new_record(r);
  for (OpCase& c : r.samples) c.op = r.name;
  records().push_back(std::move(r));
}

std::vector<OpRecord> registered_records() {
  std::lock_guard<std::mutex> lk(registry_mutex());
  return {records().begin(), records().end()};
}

const OpRecord& registered_record(const std::string& op) {
  std::lock_guard<std::mutex> lk(registry_mutex());
  for (const OpRecord& r : records())
    if (r.name == op) return r;
  fail("no registered op record '" + op + "'");
}

std::vector<OpCase> registered_cases() {
  std::lock_guard<std::mutex> lk(registry_mutex());
  std::vector<OpCase> out;
  for (const OpRecord& r : records()) out.insert(out.end(), r.samples.begin(), r.samples.end());
  return out;
}

std::vector<std::string> registered_case_names() {
  std::lock_guard<std::mutex> lk(registry_mutex());
  std::vector<std::string> names;
  for (const OpRecord& r : records())
    for (const OpCase& c : r.samples) names.push_back(c.name);
  return names;
}

const OpCase& registered_case(const std::string& name) {
  std::lock_guard<std::mutex> lk(registry_mutex());
  for (const OpRecord& r : records())
    for (const OpCase& c : r.samples)
      if (c.name == name) return c;
  fail("no registered op case '" + name + "'");
}

std::pair<Tensors, Tensors> case_inputs_f32_f64(const OpCase& c) {
  return case_inputs_low_f64(c, DType::f32);
}

std::pair<Tensors, Tensors> case_inputs_low_f64(const OpCase& c, DType low) {
  Generator g64(7), g32(7);
  Tensors x64 = c.make_inputs(DType::f64, g64);
  Tensors x32 = c.make_inputs(low, g32);
  for (size_t k = 0; k < x64.size(); ++k) {
    if (!x64[k].defined() || !is_floating(x64[k].dtype())) continue;
    copy_into(x32[k], x64[k]);
    copy_into(x64[k], x32[k]);
    x32[k].zero_grad();
    x64[k].zero_grad();
  }
  return {x32, x64};
}

OpCase backward_op_case(std::string name, std::string op, Shape in_shape, Shape out_shape,
                        std::function<Tensor(const Tensor&)> forward) {
  return OpCase{
      .name = std::move(name),
      .op = std::move(op),
      .make_inputs = [out_shape](DType dt,
                                 Generator& g) { return Tensors{case_input(out_shape, dt, g)}; },
      .fn =
          [in_shape, forward](const Tensors& v) {
            // Under NoGrad (gradcheck's central differences) only the value is wanted: the
            // forward still records, for its backward, but nothing stays on the tape.
            const bool record = autograd::grad_enabled();
            autograd::EnableGrad on;
            Tensor z = zeros(in_shape, case_dtype(v[0])).requires_grad_();
            return autograd::grad({forward(z)}, {z}, {v[0]}, {.create_graph = record})[0];
          }};
}

DType case_dtype(const Tensor& x) { return x.defined() ? x.dtype() : DType::f64; }

Tensor case_input(const Shape& shape, DType dt, Generator& g, double lo, double hi) {
  return rand(shape, dt, g, lo, hi).requires_grad_();
}

Tensor case_input_t(const Shape& shape, DType dt, Generator& g, double lo, double hi) {
  if (shape.size() < 2) fail("case_input_t: needs rank >= 2, got " + shape_str(shape));
  Shape st = shape;
  std::swap(st[st.size() - 1], st[st.size() - 2]);
  Tensor base = rand(st, dt, g, lo, hi);
  Shape strides = base.strides();
  std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
  return Tensor::view_of(base, shape, strides, 0).requires_grad_();
}

OpCase one_input_case(std::string name, std::string op, Shape shape, bool transposed,
                      std::function<Tensor(const Tensor&)> fn, double lo, double hi) {
  return OpCase{.name = std::move(name),
                .op = std::move(op),
                .make_inputs =
                    [shape, transposed, lo, hi](DType dt, Generator& g) {
                      return Tensors{transposed ? case_input_t(shape, dt, g, lo, hi)
                                                : case_input(shape, dt, g, lo, hi)};
                    },
                .fn = [fn](const Tensors& x) { return fn(x[0]); }};
}

std::string check_error_input(const ErrorInput& e) {
  try {
    e.call();
  } catch (const Error& err) {
    const std::string m = err.what();
    if (m.find(e.message) != std::string::npos) return "";
    return e.what + ": the error \"" + m + "\" does not contain \"" + e.message + "\"";
  } catch (const std::exception& other) {
    return e.what + ": threw a non-graft exception: " + other.what();
  }
  return e.what + ": nothing was thrown (want an error containing \"" + e.message + "\")";
}

GradcheckResult check_f32_vs_f64(const OpCase& c) {
  auto [x32, x64] = case_inputs_f32_f64(c);
  return compare_f32_f64(c.fn, x32, x64, {c.f32_atol, c.f32_rtol});
}

double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::bf16:
      return std::ldexp(1.0, -8);
    case DType::f16:
      return std::ldexp(1.0, -11);
    case DType::f32:
      return std::ldexp(1.0, -24);
    default:
      fail(std::string("unit_roundoff: ") + dtype_name(dt) + " is not a float dtype it knows");
  }
}

GradcheckResult check_low_vs_f64(const OpCase& c, DType low) {
  auto [xl, x64] = case_inputs_low_f64(c, low);
  const double k = c.low_depth * unit_roundoff(low);
  return compare_f32_f64(c.fn, xl, x64, {k, k});
}

GradcheckResult check_f32_vs_f64_double_backward(const OpCase& c) {
  auto [x32, x64] = case_inputs_f32_f64(c);
  return compare_f32_f64_double_backward(c.fn, x32, x64, {c.f32_atol, c.f32_rtol});
}

}  // namespace graft
