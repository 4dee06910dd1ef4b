// Anomaly mode: the first NaN/Inf is named by op, direction, shape and module path.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>

#include "graft/autograd/tape.h"
#include "graft/nn/layers.h"
#include "graft/nn/module.h"
#include "graft/ops/ops.h"
#include "test_util.h"

using namespace graft;
using graft::testing::names;

namespace {

// A two-level model: block.proj (a Linear) then an activation inside "block".
class Block : public nn::Module {
 public:
  enum class Act { log, sqrt };
  Block(Act act, Generator& gen) : act_(act) {
    proj = register_module("proj", std::make_shared<nn::Linear>(4, 4, true, DType::f32, gen));
  }
  Tensor forward(const Tensor& x) const {
    const auto named = scope();
    const Tensor h = proj->forward(x);
    return act_ == Act::log ? log(h) : sqrt(relu(h));
  }
  std::shared_ptr<nn::Linear> proj;

 private:
  Act act_;
};

class Model : public nn::Module {
 public:
  Model(Block::Act act, Generator& gen) {
    block = register_module("block", std::make_shared<Block>(act, gen));
  }
  Tensor loss(const Tensor& x) const { return sum(block->forward(x)); }
  std::shared_ptr<Block> block;
};

}  // namespace

BOOST_AUTO_TEST_CASE(forward_nan_names_op_and_module) {
  Generator gen(1);
  Model m(Block::Act::log, gen);
  // A weight of -1 and no bias: the projection of a positive input is negative, log gives NaN.
  {
    autograd::NoGrad ng;
    fill_(m.block->proj->weight, -1.0);
    fill_(m.block->proj->bias, 0.0);
  }
  const Tensor x = ones({2, 4}, DType::f32);
  // Off: the NaN goes through silently, as in any framework.
  BOOST_TEST(std::isnan(m.loss(x).item()));
  autograd::clear_tape();
  autograd::AnomalyMode on;
  BOOST_CHECK_EXCEPTION(m.loss(x), Error, [](const Error& e) {
    return names(e, "anomaly: forward of 'log' (f32 (2, 4)) in block produced NaN");
  });
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(backward_only_inf_names_op_and_module) {
  Generator gen(1);
  Model m(Block::Act::sqrt, gen);
  {
    autograd::NoGrad ng;
    fill_(m.block->proj->weight, 0.0);  // sqrt(relu(0)) = 0 forward; its derivative 1/(2·0) = Inf
    fill_(m.block->proj->bias, 0.0);
  }
  const Tensor x = ones({2, 4}, DType::f32);
  autograd::AnomalyMode on;
  Tensor l = m.loss(x);  // finite forward: nothing thrown yet
  BOOST_TEST(l.item() == 0.0);
  BOOST_CHECK_EXCEPTION(l.backward(), Error, [](const Error& e) {
    return names(e, "anomaly: backward of 'sqrt' (f32 (2, 4)) in block produced Inf");
  });
}

BOOST_AUTO_TEST_CASE(non_finite_input_from_outside_the_tape_is_named) {
  autograd::AnomalyMode on;
  Tensor w = ones({3}, DType::f64).requires_grad_();
  Tensor x = full({3}, NAN, DType::f64);
  BOOST_CHECK_EXCEPTION(mul(w, x), Error, [](const Error& e) {
    return names(e, "anomaly: input 1 of 'mul' (f64 (3)) holds NaN");
  });
}

BOOST_AUTO_TEST_CASE(scopes_cost_nothing_when_off_and_nest_when_on) {
  BOOST_TEST(!autograd::anomaly_mode());
  {
    autograd::NameScope a("encoder");
    BOOST_TEST(autograd::name_scope_path() == "");
  }
  autograd::AnomalyMode on;
  autograd::NameScope a("encoder");
  autograd::NameScope b("layers.1");
  BOOST_TEST(autograd::name_scope_path() == "encoder.layers.1");
}
