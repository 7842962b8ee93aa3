#include "exl3/status.h"

namespace exl3 {

const char* status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "ok";
        case StatusCode::kInvalidArgument: return "invalid argument";
        case StatusCode::kNotFound: return "not found";
        case StatusCode::kUnsupported: return "unsupported";
        case StatusCode::kIoError: return "i/o error";
        case StatusCode::kOutOfRange: return "out of range";
        case StatusCode::kInternal: return "internal error";
    }
    return "unknown";
}

std::string Status::to_string() const {
    if (is_ok()) return "ok";
    return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(code_, context + ": " + message_);
}

}  // namespace exl3
