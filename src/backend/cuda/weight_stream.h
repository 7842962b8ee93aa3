// Where the CUDA executor's weights live (docs/memory.md): counted before anything is allocated (CountingPlacer, the
// memory plan's figures), then placed in one device arena (ArenaPlacer), except the offloaded layers of the kStream
// mode, which stay in pinned host memory and are copied into one of two device staging slots each step, the copy of a
// layer overlapping the compute of the one before (WeightStream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/device_weights.h"
#include "models/executor.h"

namespace exl3::cuda {

// Counts what upload() would place, by layer and kind (nothing is allocated, fill is never called). The buffers get
// distinct fake addresses, so that the DeviceWeights it leaves behind has the shapes of the real one (the workspace
// sizes are computed from it) but must never reach a kernel.
class CountingPlacer final : public WeightPlacer {
public:
    explicit CountingPlacer(size_t layers) : layers_(layers) {}
    Status place(DeviceBuffer& b, size_t bytes, WeightKind kind, const std::function<void(void*)>& fill) override;

    const std::vector<LayerDeviceBytes>& layers() const { return layers_; }
    int64_t embed = 0, head = 0, final_norm = 0;

private:
    std::vector<LayerDeviceBytes> layers_;
    uintptr_t next_ = uintptr_t{1} << 44;
};

// The offloaded layers of the kStream mode: each one's tensors in a pinned host blob laid out as in its staging slot,
// slot j % 2 for the j-th of them. Per step: the first two copies start at the step's beginning (over the compute of
// the resident layers); entering layer j waits for its copy and refills the slot of layer j - 1 with layer j + 1.
class WeightStream {
public:
    ~WeightStream();
    // Layers [first, first + bytes.size()) with their counted bytes; allocates the blobs and the two slots.
    Status init(int first, const std::vector<int64_t>& bytes);
    int first() const { return first_; }
    bool streams(int layer) const { return layer >= first_ && layer < first_ + static_cast<int>(blobs_.size()); }
    // A tensor of a streamed layer: written into its blob, `b` a view of where it lands in the slot.
    Status place(int layer, DeviceBuffer& b, size_t bytes, const std::function<void(void*)>& fill);
    size_t slot_bytes() const { return slot_bytes_; }

    Status begin_step(cudaStream_t compute);
    // Called as the decoder enters `layer` (any layer; only streamed ones do anything).
    Status enter_layer(int layer, cudaStream_t compute);

private:
    Status copy(int j);  // blob j into its slot, on the copy stream
    int first_ = 0;
    std::vector<PinnedBuffer> blobs_;
    std::vector<size_t> used_;  // bytes placed into each blob so far
    DeviceBuffer slots_[2];
    size_t slot_bytes_ = 0;
    cudaStream_t copy_ = nullptr;
    cudaEvent_t start_ = nullptr, copied_[2] = {nullptr, nullptr}, freed_[2] = {nullptr, nullptr};
};

// Resident tensors into one device arena (sized by a CountingPlacer's pass); the streamed layers' into `stream`; the
// CPU-run layers' nowhere (their buffers stay empty: those layers never reach a kernel).
class ArenaPlacer final : public WeightPlacer {
public:
    ArenaPlacer(DeviceBuffer& arena, WeightStream* stream, int first_cpu_layer)
        : arena_(arena), stream_(stream), first_cpu_(first_cpu_layer) {}
    Status place(DeviceBuffer& b, size_t bytes, WeightKind kind, const std::function<void(void*)>& fill) override;
    size_t used() const { return used_; }

private:
    DeviceBuffer& arena_;
    WeightStream* stream_;
    int first_cpu_;
    size_t used_ = 0;
    std::vector<uint8_t> host_;
};

}  // namespace exl3::cuda
