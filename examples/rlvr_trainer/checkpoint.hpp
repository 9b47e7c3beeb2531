// checkpoint.hpp — the trainer's checkpoint file: named entries of a torch archive inside a checked
// envelope, and the typed reads and writes of those entries.
//
// File layout (integers little-endian):
//   offset  0  magic "RLVRCKPT"                              8 bytes
//           8  format version (checkpoint_format_version)   u32
//          12  reserved, 0                                   u32
//          16  archive bytes n                               u64
//          24  torch::serialize::OutputArchive (its zip)     n bytes
//      24 + n  CRC-64/XZ of bytes [0, 24 + n)                u64
// Entries are flat keys ("trainer/kl_controller", "rollout/scheduler", ...): tensors, integers,
// doubles, strings, and byte blobs (uint8 tensors) for ulorl's own state machines, which check their
// bytes again on restore (ulorl/core/checkpoint.hpp's envelope). Who writes which entries:
// grpo_trainer::save, segment_rollout::save, training_loop::save (trainer.hpp, rollout.hpp).
//
// The file is replaced atomically (ulorl's write_file_atomically: a temporary in the same directory,
// written in full, fsync'ed and renamed over the target, then the directory fsync'ed), so a process
// killed during a save leaves the previous checkpoint in place. Reading checks the size, magic,
// version, length and checksum before torch parses a byte: a truncated, corrupted or foreign file
// (a --checkpoint warm-up file, which holds weights only, among them) throws checkpoint_error naming
// the path and what is wrong; a missing entry or one of another type names the entry.
#pragma once

#include <torch/torch.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <ulorl/core/checkpoint.hpp>
#include <ulorl/core/checkpoint_file.hpp>

namespace rlvr {

//! A checkpoint that cannot be read or does not fit the objects it is loaded into.
struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline constexpr std::uint32_t checkpoint_format_version = 1;

namespace ckpt {

inline constexpr char magic[8] = {'R', 'L', 'V', 'R', 'C', 'K', 'P', 'T'};
inline constexpr std::size_t header_bytes = 24;
inline constexpr std::size_t trailer_bytes = 8;

inline void put_int(torch::serialize::OutputArchive& a, const std::string& key, std::int64_t v) {
  a.write(key, c10::IValue(v));
}
inline void put_double(torch::serialize::OutputArchive& a, const std::string& key, double v) {
  a.write(key, c10::IValue(v));
}
inline void put_string(torch::serialize::OutputArchive& a, const std::string& key, const std::string& v) {
  a.write(key, c10::IValue(v));
}
//! A tensor entry (a detached copy; the archive's own storage).
inline void put_tensor(torch::serialize::OutputArchive& a, const std::string& key, const torch::Tensor& t) {
  a.write(key, t.detach().clone().contiguous());
}
inline void put_bytes(torch::serialize::OutputArchive& a, const std::string& key, std::span<const std::byte> bytes) {
  auto t = torch::empty({static_cast<std::int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr<std::uint8_t>(), bytes.data(), bytes.size());
  a.write(key, t);
}

[[noreturn]] inline void missing(const std::string& key, const char* what) {
  throw checkpoint_error("checkpoint: entry '" + key + "' is missing or not " + what);
}

[[nodiscard]] inline std::int64_t get_int(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isInt()) missing(key, "an integer");
  return v.toInt();
}
[[nodiscard]] inline double get_double(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isDouble()) missing(key, "a double");
  return v.toDouble();
}
[[nodiscard]] inline std::string get_string(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isString()) missing(key, "a string");
  return v.toStringRef();
}
//! A tensor entry of dtype `dtype` and `dims` dimensions (any sizes).
[[nodiscard]] inline torch::Tensor get_tensor(torch::serialize::InputArchive& a, const std::string& key,
                                              torch::Dtype dtype, std::int64_t dims) {
  torch::Tensor t;  // undefined: try_read hands over the stored tensor instead of resizing one in place
  if (!a.try_read(key, t) || !t.defined()) missing(key, "a tensor");
  if (t.scalar_type() != dtype || t.dim() != dims)
    throw checkpoint_error("checkpoint: entry '" + key + "' is a " + std::to_string(t.dim()) + "-d " +
                           std::string(c10::toString(t.scalar_type())) + " tensor, expected " +
                           std::to_string(dims) + "-d " + std::string(c10::toString(dtype)));
  return t.contiguous();
}
[[nodiscard]] inline std::vector<std::byte> get_bytes(torch::serialize::InputArchive& a, const std::string& key) {
  const auto t = get_tensor(a, key, torch::kUInt8, 1);
  std::vector<std::byte> out(static_cast<std::size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), t.data_ptr<std::uint8_t>(), out.size());
  return out;
}
//! A nested archive (the optimizer's).
[[nodiscard]] inline torch::serialize::InputArchive get_archive(torch::serialize::InputArchive& a,
                                                                const std::string& key) {
  torch::serialize::InputArchive nested;
  if (!a.try_read(key, nested)) missing(key, "an archive");
  return nested;
}

//! Throws checkpoint_error "what: checkpoint has `saved`, this run has `here`" when they differ.
template <class T>
void require_equal(const std::string& what, const T& saved, const T& here) {
  if (saved == here) return;
  const auto text = [](const T& v) {
    if constexpr (std::is_convertible_v<T, std::string>) {
      return std::string(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      char b[32];
      std::snprintf(b, sizeof b, "%.17g", static_cast<double>(v));
      return std::string(b);
    } else {
      return std::to_string(v);
    }
  };
  throw checkpoint_error("checkpoint does not fit: " + what + " is " + text(saved) + " in the checkpoint, " +
                         text(here) + " here");
}

inline void put_u32(std::vector<std::byte>& out, std::size_t at, std::uint32_t v) {
  for (std::size_t i = 0; i < 4; ++i) out[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFu);
}
inline void put_u64(std::vector<std::byte>& out, std::size_t at, std::uint64_t v) {
  for (std::size_t i = 0; i < 8; ++i) out[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFu);
}
[[nodiscard]] inline std::uint64_t get_le(std::span<const std::byte> in, std::size_t at, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in[at + i]) << (8 * i);
  return v;
}

}  // namespace ckpt

//! The file's bytes: the envelope around the archive `a` (see the top of this file).
[[nodiscard]] inline std::vector<std::byte> checkpoint_bytes(torch::serialize::OutputArchive& a) {
  std::vector<std::byte> out(ckpt::header_bytes);
  a.save_to([&](const void* data, std::size_t n) -> std::size_t {
    const auto* p = static_cast<const std::byte*>(data);
    out.insert(out.end(), p, p + n);
    return n;
  });
  std::memcpy(out.data(), ckpt::magic, sizeof ckpt::magic);
  ckpt::put_u32(out, 8, checkpoint_format_version);
  ckpt::put_u32(out, 12, 0);
  ckpt::put_u64(out, 16, out.size() - ckpt::header_bytes);
  const auto crc = ulorl::detail::crc64(out);
  out.resize(out.size() + ckpt::trailer_bytes);
  ckpt::put_u64(out, out.size() - ckpt::trailer_bytes, crc);
  return out;
}

//! The archive in `bytes` (a whole file); `source` names it in errors. Checks the envelope first.
[[nodiscard]] inline torch::serialize::InputArchive read_checkpoint_bytes(std::span<const std::byte> bytes,
                                                                         const std::string& source) {
  const auto fail = [&](const std::string& what) -> void {
    throw checkpoint_error("checkpoint " + source + ": " + what);
  };
  const std::size_t frame = ckpt::header_bytes + ckpt::trailer_bytes;
  if (bytes.size() >= sizeof ckpt::magic && std::memcmp(bytes.data(), ckpt::magic, sizeof ckpt::magic) != 0)
    fail("not an rlvr_train training checkpoint (no RLVRCKPT header; a --checkpoint warm-up file holds weights "
         "only and loads with --checkpoint)");
  if (bytes.size() < frame)
    fail("truncated: " + std::to_string(bytes.size()) + " bytes, less than the " + std::to_string(frame) +
         "-byte frame");
  const auto version = static_cast<std::uint32_t>(ckpt::get_le(bytes, 8, 4));
  if (version != checkpoint_format_version)
    fail("format version " + std::to_string(version) + ", this build reads version " +
         std::to_string(checkpoint_format_version));
  const auto n = ckpt::get_le(bytes, 16, 8);
  if (n > bytes.size() - frame)
    fail("truncated: the header announces " + std::to_string(n) + " archive bytes, the file holds " +
         std::to_string(bytes.size() - frame));
  if (n < bytes.size() - frame)
    fail(std::to_string(bytes.size() - frame - n) + " bytes after the checkpoint's end");
  const auto body = bytes.first(ckpt::header_bytes + static_cast<std::size_t>(n));
  if (ulorl::detail::crc64(body) != ckpt::get_le(bytes, body.size(), 8))
    fail("checksum mismatch: the file is corrupted");
  torch::serialize::InputArchive a;
  try {
    a.load_from(reinterpret_cast<const char*>(bytes.data() + ckpt::header_bytes), static_cast<std::size_t>(n));
  } catch (const c10::Error& e) {
    fail(std::string("the archive does not parse: ") + e.what_without_backtrace());
  }
  return a;
}

//! Writes the archive `a` to `path` atomically: `path` holds its previous contents or all of the
//! new checkpoint, whenever the process stops.
inline void write_checkpoint_file(const std::string& path, torch::serialize::OutputArchive& a) {
  const auto bytes = checkpoint_bytes(a);
  ulorl::detail::write_file_atomically(path, bytes);
}

//! The archive of the checkpoint file `path` (checked as by read_checkpoint_bytes).
[[nodiscard]] inline torch::serialize::InputArchive read_checkpoint_file(const std::string& path) {
  std::vector<std::byte> bytes;
  try {
    bytes = ulorl::detail::read_file(path, "read_file");
  } catch (const std::exception& e) {
    throw checkpoint_error("checkpoint '" + path + "': " + e.what());
  }
  return read_checkpoint_bytes(bytes, "'" + path + "'");
}

//! The one line of a torch error (c10::Error's what() carries a C++ backtrace after it).
[[nodiscard]] inline std::string torch_error_text(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string s = c10 != nullptr ? c10->what_without_backtrace() : e.what();
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

//! Loads weights written by save_weights (torch::save) from `path` into `module`, when `path` exists;
//! false when nothing is there. A path that is not a regular file (never opened, so a FIFO cannot
//! block; the bytes are read by ulorl::detail::read_file and parsed from memory), a file torch
//! cannot load (garbage, truncated) or the weights of another model (a tensor of another shape:
//! torch would take it as it is) throws checkpoint_error "<flag> '<path>': ..." without a
//! backtrace; the module's weights are then unspecified.
template <class Module>
[[nodiscard]] bool load_weights_if_present(Module& module, const std::string& path, std::string_view flag) {
  const std::string where = std::string(flag) + " '" + path + "': ";
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    throw checkpoint_error(where + "cannot open: " + std::generic_category().message(errno));
  }
  if (!S_ISREG(st.st_mode)) throw checkpoint_error(where + "is not a regular file");
  // The bytes come through the bounded, non-blocking reader (a file swapped for a FIFO after the
  // stat above is refused there too); torch parses them from memory.
  std::vector<std::byte> bytes;
  try {
    bytes = ulorl::detail::read_file(path, "read_file");
  } catch (const std::exception& e) {
    throw checkpoint_error(where + "cannot read: " + e.what());
  }
  std::istringstream in(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  bytes = {};
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> shapes;
  for (const auto& p : module->named_parameters()) shapes.emplace_back(p.key(), p.value().sizes().vec());
  for (const auto& b : module->named_buffers()) shapes.emplace_back(b.key(), b.value().sizes().vec());
  try {
    torch::load(module, in);
  } catch (const std::exception& e) {
    throw checkpoint_error(where + "cannot load the weights: " + torch_error_text(e));
  }
  std::size_t i = 0;
  const auto check = [&](const std::string& name, const torch::Tensor& t) {
    if (i >= shapes.size() || shapes[i].first != name || t.sizes().vec() != shapes[i].second)
      throw checkpoint_error(where + "cannot load the weights: '" + name + "' has shape " + c10::str(t.sizes()) +
                             (i < shapes.size() ? ", this model's is " + c10::str(c10::IntArrayRef(shapes[i].second)) : std::string()) +
                             " (the weights of another model)");
    ++i;
  };
  for (const auto& p : module->named_parameters()) check(p.key(), p.value());
  for (const auto& b : module->named_buffers()) check(b.key(), b.value());
  return true;
}

//! Saves `module`'s weights to `path` (torch::save); torch's errors throw checkpoint_error naming
//! the flag and the file.
template <class Module>
void save_weights(const Module& module, const std::string& path, std::string_view flag) {
  try {
    torch::save(module, path);
  } catch (const std::exception& e) {
    throw checkpoint_error(std::string(flag) + " '" + path + "': cannot save the weights: " + torch_error_text(e));
  }
}

}  // namespace rlvr
