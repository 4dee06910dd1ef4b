// Everything in ops/: include this to get every op.
#pragma once

#include "ops/attention.h"
#include "ops/cases.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/precision.h"
#include "ops/reduce.h"
#include "ops/rope.h"
#include "ops/shape.h"
#include "ops/softmax.h"
