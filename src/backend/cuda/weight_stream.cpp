#include "backend/cuda/weight_stream.h"

#include <cuda_runtime.h>
#include <fmt/core.h>

#include <algorithm>

namespace exl3::cuda {

Status CountingPlacer::place(DeviceBuffer& b, size_t bytes, WeightKind kind, const std::function<void(void*)>&) {
    const int64_t n = static_cast<int64_t>(weight_aligned(bytes));
    b = DeviceBuffer::view(reinterpret_cast<void*>(next_), bytes);
    next_ += static_cast<uintptr_t>(n) + kWeightAlign;
    if (layer < 0) {
        (kind == WeightKind::kEmbed ? embed : kind == WeightKind::kHead ? head : final_norm) += n;
        return Status::ok();
    }
    if (static_cast<size_t>(layer) >= layers_.size()) return internal_error("weight placed in a layer that does not exist");
    LayerDeviceBytes& l = layers_[static_cast<size_t>(layer)];
    (moe ? l.moe : kind == WeightKind::kExl3 ? l.exl3 : kind == WeightKind::kDense ? l.dense : l.norms) += n;
    return Status::ok();
}

WeightStream::~WeightStream() {
    if (copy_) cudaStreamSynchronize(copy_);
    for (cudaEvent_t e : {start_, copied_[0], copied_[1], freed_[0], freed_[1]})
        if (e) cudaEventDestroy(e);
    if (copy_) cudaStreamDestroy(copy_);
}

Status WeightStream::init(int first, const std::vector<int64_t>& bytes) {
    first_ = first;
    blobs_.resize(bytes.size());
    used_.assign(bytes.size(), 0);
    for (size_t j = 0; j < bytes.size(); ++j) {
        EXL3_RETURN_IF_ERROR(blobs_[j].allocate(static_cast<size_t>(bytes[j])));
        slot_bytes_ = std::max(slot_bytes_, static_cast<size_t>(bytes[j]));
    }
    for (int s = 0; s < 2 && s < static_cast<int>(bytes.size()); ++s) EXL3_RETURN_IF_ERROR(slots_[s].reserve(slot_bytes_));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "copy stream"));
    for (cudaEvent_t* e : {&start_, &copied_[0], &copied_[1], &freed_[0], &freed_[1]})
        EXL3_RETURN_IF_ERROR(check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "stream event"));
    return Status::ok();
}

Status WeightStream::place(int layer, DeviceBuffer& b, size_t bytes, const std::function<void(void*)>& fill) {
    const size_t j = static_cast<size_t>(layer - first_);
    const size_t off = used_[j], n = weight_aligned(bytes);
    if (off + n > blobs_[j].bytes())
        return internal_error(fmt::format("layer {}: its weights outgrow the {} bytes counted", layer, blobs_[j].bytes()));
    fill(static_cast<uint8_t*>(blobs_[j].get()) + off);
    b = DeviceBuffer::view(static_cast<uint8_t*>(slots_[j % 2].get()) + off, bytes);
    used_[j] = off + n;
    return Status::ok();
}

Status WeightStream::copy(int j) {
    const size_t s = static_cast<size_t>(j % 2);
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(slots_[s].get(), blobs_[static_cast<size_t>(j)].get(),
                                                    used_[static_cast<size_t>(j)], cudaMemcpyHostToDevice, copy_),
                                    "weight stream copy"));
    return check_cuda(cudaEventRecord(copied_[s], copy_), "weight stream copy");
}

Status WeightStream::begin_step(cudaStream_t compute) {
    if (blobs_.empty()) return Status::ok();
    // The slots are free once the compute stream has finished the previous step.
    EXL3_RETURN_IF_ERROR(check_cuda(cudaEventRecord(start_, compute), "weight stream"));
    EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamWaitEvent(copy_, start_, 0), "weight stream"));
    for (int j = 0; j < 2 && j < static_cast<int>(blobs_.size()); ++j) EXL3_RETURN_IF_ERROR(copy(j));
    return Status::ok();
}

Status WeightStream::enter_layer(int layer, cudaStream_t compute) {
    if (!streams(layer)) return Status::ok();
    const int j = layer - first_;
    if (j >= 1 && j + 1 < static_cast<int>(blobs_.size())) {
        // Layer j - 1 is enqueued whole: its slot takes layer j + 1 once the compute has read it.
        const size_t s = static_cast<size_t>((j - 1) % 2);
        EXL3_RETURN_IF_ERROR(check_cuda(cudaEventRecord(freed_[s], compute), "weight stream"));
        EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamWaitEvent(copy_, freed_[s], 0), "weight stream"));
        EXL3_RETURN_IF_ERROR(copy(j + 1));
    }
    return check_cuda(cudaStreamWaitEvent(compute, copied_[j % 2], 0), "weight stream");
}

Status ArenaPlacer::place(DeviceBuffer& b, size_t bytes, WeightKind, const std::function<void(void*)>& fill) {
    if (layer >= first_cpu_) return Status::ok();  // run by the CPU from the host weights
    if (stream_ && stream_->streams(layer)) return stream_->place(layer, b, bytes, fill);
    const size_t n = weight_aligned(bytes);
    if (used_ + n > arena_.bytes())
        return internal_error(fmt::format("the weights outgrow the {} bytes counted for them", arena_.bytes()));
    void* dst = static_cast<uint8_t*>(arena_.get()) + used_;
    host_.resize(bytes);
    fill(host_.data());
    EXL3_RETURN_IF_ERROR(check_cuda(cudaMemcpy(dst, host_.data(), bytes, cudaMemcpyHostToDevice), "weight upload"));
    b = DeviceBuffer::view(dst, bytes);
    used_ += n;
    return Status::ok();
}

}  // namespace exl3::cuda
