/// @file
/// The gradcheck cases of the library's own ops, registered by an explicit call (no static
/// initialisers, so the ops library works static or shared). tests/test_gradcheck_all calls
/// register_op_cases() and then checks every registered case (graft/testing/registry.h).
#pragma once

#include "graft/testing/registry.h"

namespace graft {

/// Registers the gradcheck cases of every op family and of the engine's own ops
/// (register_autograd_cases()); idempotent and thread-safe.
void register_op_cases();

}  // namespace graft
