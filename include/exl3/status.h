// Status and Result<T>: the error model of the whole library API.
// Errors carry a message a user can act on (which file, which tensor, what was expected and what was found).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace exl3 {

enum class StatusCode {
    kOk = 0,
    kInvalidArgument,  // bad input from the caller or a file: malformed, inconsistent, out of range
    kNotFound,         // a file, tensor or key that should exist does not
    kUnsupported,      // well-formed but not handled (unknown architecture, rope type, dtype)
    kIoError,          // the OS refused: open, stat, mmap, read
    kOutOfRange,       // a request exceeds a limit (context length, cache size)
    kInternal,         // a bug: an impossible state was reached
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok() { return {}; }

    bool is_ok() const { return code_ == StatusCode::kOk; }
    explicit operator bool() const { return is_ok(); }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }
    // "invalid argument: <message>"
    std::string to_string() const;

    // Prefixes context to the message ("loading model.safetensors: " + message), keeps the code.
    Status with_context(const std::string& context) const;

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
    Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
        assert(!status_.is_ok() && "Result constructed from an ok Status without a value");
        if (status_.is_ok()) static_cast<void>(status_ = internal_error("Result built from an ok status without a value"));
    }

    bool is_ok() const { return value_.has_value(); }
    explicit operator bool() const { return is_ok(); }
    const Status& status() const { return status_; }

    T& value() & { return *value_; }
    const T& value() const& { return *value_; }
    T&& value() && { return std::move(*value_); }
    T* operator->() { return &*value_; }
    const T* operator->() const { return &*value_; }
    T& operator*() & { return *value_; }
    const T& operator*() const& { return *value_; }
    T&& operator*() && { return std::move(*value_); }

private:
    std::optional<T> value_;
    Status status_;
};

}  // namespace exl3

// Propagate a failed Status from an expression returning Status.
#define EXL3_RETURN_IF_ERROR(expr)                 \
    do {                                           \
        ::exl3::Status exl3_status_ = (expr);      \
        if (!exl3_status_.is_ok()) return exl3_status_; \
    } while (0)

#define EXL3_CONCAT_INNER_(a, b) a##b
#define EXL3_CONCAT_(a, b) EXL3_CONCAT_INNER_(a, b)
// EXL3_ASSIGN_OR_RETURN(auto x, make_x()); declares x from a Result<T> or returns its Status.
#define EXL3_ASSIGN_OR_RETURN(lhs, expr) EXL3_ASSIGN_OR_RETURN_IMPL_(EXL3_CONCAT_(exl3_result_, __LINE__), lhs, expr)
#define EXL3_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
    auto tmp = (expr);                              \
    if (!tmp.is_ok()) return tmp.status();          \
    lhs = std::move(tmp).value()
