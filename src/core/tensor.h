// A non-owning view of a tensor: pointer + dtype + shape, row-major and contiguous (as in checkpoints).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace exl3 {

struct TensorView {
    const void* data = nullptr;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
    int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? static_cast<int>(shape.size()) + i : i)]; }
    size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
    template <typename T>
    const T* as() const {
        return static_cast<const T*>(data);
    }
};

// "[4096, 128]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace exl3
