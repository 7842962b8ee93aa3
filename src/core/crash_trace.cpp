#include "core/crash_trace.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace exl3 {

namespace {

void put(const char* s) {
    const ssize_t r = ::write(STDERR_FILENO, s, std::strlen(s));
    (void)r;
}

const char* signal_name(int sig) {
    switch (sig) {
        case SIGSEGV: return "SIGSEGV";
        case SIGABRT: return "SIGABRT";
        case SIGBUS: return "SIGBUS";
        case SIGFPE: return "SIGFPE";
        case SIGILL: return "SIGILL";
        default: return "a fatal signal";
    }
}

// Only async-signal-safe calls, and backtrace(), primed at install so that it does not load libgcc here.
void on_fatal(int sig, siginfo_t* info, void*) {
    put("\n*** exl3: ");
    put(signal_name(sig));
    if (sig == SIGSEGV || sig == SIGBUS) {
        char buf[32];
        auto a = reinterpret_cast<unsigned long long>(info ? info->si_addr : nullptr);
        int n = 0;
        char tmp[20];
        do {
            tmp[n++] = "0123456789abcdef"[a & 15];
            a >>= 4;
        } while (a && n < 16);
        int k = 0;
        buf[k++] = '0';
        buf[k++] = 'x';
        while (n) buf[k++] = tmp[--n];
        buf[k] = 0;
        put(" at address ");
        put(buf);
    }
    put("; backtrace (addr2line -e <unstripped binary> <offset> for static functions):\n");
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    put("***\n");
    // SA_RESETHAND restored the default action: die of the same signal (exit status 128 + sig, a core if enabled).
    raise(sig);
}

std::atomic<bool> g_installed{false};

}  // namespace

void install_crash_backtrace() {
    if (g_installed.exchange(true)) return;
    void* prime[1];
    backtrace(prime, 1);
    // Its own stack, so that a stack overflow still prints.
    static char alt[64 * 1024];
    stack_t ss{};
    ss.ss_sp = alt;
    ss.ss_size = sizeof(alt);
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

}  // namespace exl3
