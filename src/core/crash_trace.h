// A backtrace on stderr when the process dies of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL), for
// programs and test binaries run where no debugger is (the GPU machine). Link the program with ENABLE_EXPORTS
// (-rdynamic) so that the frames carry function names; the offsets also resolve with addr2line against the unstripped
// build. The signal is then raised again with its default action: the exit status stays the signal's.
#pragma once

namespace exl3 {

// Installs the handlers (idempotent). Call early in main, or from a test binary's static initializer.
void install_crash_backtrace();

}  // namespace exl3
