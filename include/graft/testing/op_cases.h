/// @file
/// The records of the library's own ops, registered by an explicit call (no static initialisers,
/// so the libraries work static or shared). tests/test_gradcheck_all calls register_op_cases()
/// and then checks every registered record (graft/testing/registry.h). In graft_testing.
#pragma once

#include "graft/testing/registry.h"

namespace graft {

/// Registers the record of every op of every family and of the engine's own ops
/// (register_autograd_cases()); idempotent and thread-safe.
void register_op_cases();

}  // namespace graft
