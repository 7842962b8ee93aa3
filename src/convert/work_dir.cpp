#include "convert/work_dir.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace exl3::convert {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kStateMagic = 0x53334C45u;  // "EL3S"

Status write_atomic(const std::string& path, const void* data, size_t n) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) return io_error(fmt::format("work dir: cannot write '{}'", tmp));
        f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
        f.flush();
        if (!f) return io_error(fmt::format("work dir: writing '{}' failed (disk full?)", tmp));
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) return io_error(fmt::format("work dir: cannot rename '{}': {}", tmp, ec.message()));
    return Status::ok();
}

Status write_json(const std::string& path, const nlohmann::ordered_json& j) {
    const std::string s = j.dump(2) + "\n";
    return write_atomic(path, s.data(), s.size());
}

Result<nlohmann::ordered_json> read_json(const std::string& path) {
    std::ifstream f(path);
    if (!f) return not_found(path);
    auto j = nlohmann::ordered_json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return invalid_argument(fmt::format("work dir: '{}' is not valid JSON; delete the work dir to start over", path));
    return j;
}

Result<std::vector<uint8_t>> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return not_found(path);
    std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return b;
}

}  // namespace

uint64_t file_hash(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    char buf[1 << 16];
    while (f) {
        f.read(buf, sizeof(buf));
        for (std::streamsize i = 0; i < f.gcount(); ++i) h = (h ^ static_cast<uint8_t>(buf[i])) * 0x100000001b3ull;
    }
    return h;
}

Result<WorkDir> WorkDir::open(const std::string& dir, const nlohmann::ordered_json& fingerprint) {
    WorkDir w;
    if (dir.empty()) return w;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return io_error(fmt::format("cannot create work dir '{}': {}", dir, ec.message()));
    w.dir_ = dir;
    const std::string opath = dir + "/options.json";
    if (!fs::exists(opath)) {
        // A fresh work dir (or one whose first layer never finished): start over.
        fs::remove(dir + "/progress.json", ec);
        EXL3_RETURN_IF_ERROR(write_json(opath, fingerprint));
        return w;
    }
    EXL3_ASSIGN_OR_RETURN(nlohmann::ordered_json old, read_json(opath));
    std::string diff;
    for (const auto& [k, v] : fingerprint.items()) {
        const auto it = old.find(k);
        const std::string was = it == old.end() ? "(absent)" : it->dump();
        if (was != v.dump()) diff += fmt::format("\n  {}: {} in the work dir, {} now", k, was, v.dump());
    }
    if (!diff.empty())
        return invalid_argument(fmt::format("work dir '{}' belongs to a conversion with other options; rerun with the "
                                            "same arguments, or use another (or an emptied) --work-dir:{}",
                                            dir, diff));
    auto prog = read_json(dir + "/progress.json");
    if (prog.is_ok()) {
        const auto it = prog->find("finished_layers");
        if (it == prog->end() || !it->is_number_integer() || it->get<int>() < 0)
            return invalid_argument(fmt::format("work dir '{}': progress.json is damaged; delete the work dir", dir));
        w.finished_ = it->get<int>();
    }
    return w;
}

Status WorkDir::save_tokens(const std::vector<int32_t>& toks) const {
    return write_atomic(dir_ + "/calibration.bin", toks.data(), toks.size() * sizeof(int32_t));
}

Result<bool> WorkDir::load_tokens(std::vector<int32_t>* toks) const {
    auto b = read_bytes(dir_ + "/calibration.bin");
    if (!b.is_ok()) return false;
    if (b->size() % sizeof(int32_t) != 0)
        return invalid_argument(fmt::format("work dir '{}': calibration.bin is truncated; delete the work dir", dir_));
    toks->resize(b->size() / sizeof(int32_t));
    std::memcpy(toks->data(), b->data(), b->size());
    return true;
}

Status WorkDir::save_allocation(const std::vector<int>& ks, double achieved) const {
    nlohmann::ordered_json j = {{"K", ks}, {"achieved_bpw", achieved}};
    return write_json(dir_ + "/allocation.json", j);
}

Result<bool> WorkDir::load_allocation(size_t n, std::vector<int>* ks, double* achieved) const {
    auto j = read_json(dir_ + "/allocation.json");
    if (!j.is_ok()) {
        if (j.status().code() == StatusCode::kNotFound) return false;
        return j.status();
    }
    if (!j->contains("K") || !(*j)["K"].is_array() || (*j)["K"].size() != n || !j->contains("achieved_bpw"))
        return invalid_argument(fmt::format("work dir '{}': allocation.json does not fit this model; delete the work "
                                            "dir", dir_));
    *ks = (*j)["K"].get<std::vector<int>>();
    *achieved = (*j)["achieved_bpw"].get<double>();
    return true;
}

std::string WorkDir::layer_path(int li) const {
    return fmt::format("{}/layer_{:03d}.safetensors", dir_, li);
}

Status WorkDir::save_layer(int li, const SafetensorsWriter& tensors, const std::vector<float>& state) {
    EXL3_RETURN_IF_ERROR(tensors.write(layer_path(li)));
    std::vector<uint8_t> blob(16 + state.size() * sizeof(float));
    const uint32_t magic = kStateMagic, layer = static_cast<uint32_t>(li);
    const uint64_t n = state.size();
    std::memcpy(blob.data(), &magic, 4);
    std::memcpy(blob.data() + 4, &layer, 4);
    std::memcpy(blob.data() + 8, &n, 8);
    std::memcpy(blob.data() + 16, state.data(), state.size() * sizeof(float));
    EXL3_RETURN_IF_ERROR(write_atomic(dir_ + "/state.bin", blob.data(), blob.size()));
    EXL3_RETURN_IF_ERROR(write_json(dir_ + "/progress.json", {{"finished_layers", li + 1}}));
    finished_ = li + 1;
    return Status::ok();
}

Result<std::vector<float>> WorkDir::load_state(size_t n) const {
    auto b = read_bytes(dir_ + "/state.bin");
    if (!b.is_ok()) return invalid_argument(fmt::format("work dir '{}': state.bin is missing; delete the work dir", dir_));
    uint32_t magic = 0, layer = 0;
    uint64_t m = 0;
    if (b->size() >= 16) {
        std::memcpy(&magic, b->data(), 4);
        std::memcpy(&layer, b->data() + 4, 4);
        std::memcpy(&m, b->data() + 8, 8);
    }
    if (magic != kStateMagic || m != n || b->size() != 16 + n * sizeof(float) ||
        static_cast<int>(layer) + 1 != finished_)
        return invalid_argument(fmt::format("work dir '{}': state.bin does not match progress.json (layer {}, {} "
                                            "values, {} expected); delete the work dir", dir_, layer, m, n));
    std::vector<float> s(n);
    std::memcpy(s.data(), b->data() + 16, n * sizeof(float));
    return s;
}

void WorkDir::discard(const std::string& dir) {
    if (dir.empty()) return;
    std::error_code ec;
    for (const char* f : {"progress.json", "options.json", "calibration.bin", "allocation.json", "state.bin"})
        fs::remove(dir + "/" + f, ec);
    std::vector<fs::path> layers;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("layer_", 0) == 0 && e.path().extension() == ".safetensors") layers.push_back(e.path());
    }
    for (const auto& l : layers) fs::remove(l, ec);
    fs::remove(dir, ec);  // only when nothing else is left in it
}

}  // namespace exl3::convert
