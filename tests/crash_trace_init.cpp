// Linked into the test binaries that run on the GPU machine (exl3_add_test CRASH_TRACE): a crash prints where it
// happened before the process dies.
#include "core/crash_trace.h"

namespace {
const bool g_crash_trace = (exl3::install_crash_backtrace(), true);
}  // namespace
