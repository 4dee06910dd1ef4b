/// @file
/// Everything in ops/: include this to get every op.
#pragma once

#include "graft/ops/attention.h"
#include "graft/ops/compare.h"
#include "graft/ops/dropout.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/heads.h"
#include "graft/ops/loss.h"
#include "graft/ops/matmul.h"
#include "graft/ops/norm.h"
#include "graft/ops/precision.h"
#include "graft/ops/reduce.h"
#include "graft/ops/rope.h"
#include "graft/ops/shape.h"
#include "graft/ops/softmax.h"
