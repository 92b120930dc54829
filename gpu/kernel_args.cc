#include "gpu/kernel_args.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <utility>

namespace kvfabric::gpu {
namespace {

std::string Num(std::uint64_t v) { return std::to_string(v); }

// `a * b`, or InvalidArgument "<what>: <a> * <b> overflows 64 bits".
Status CheckedMul(std::uint64_t a, std::uint64_t b, std::string_view what, std::uint64_t* out) {
  if (__builtin_mul_overflow(a, b, out)) {
    return Status::InvalidArgument(std::string(what) + ": " + Num(a) + " * " + Num(b) +
                                   " overflows 64 bits");
  }
  return Status::OK();
}

// A factor of a layout size, named for the error message.
struct Factor {
  const char* name;
  std::uint64_t value;
};

// One range of a kernel's arguments, with the size its layout requires
// (the product of `factors`, computed overflow-checked by the caller). Holds no
// strings: validation runs on the decode path and must not allocate unless it
// fails.
struct NamedRange {
  const char* name;  // e.g. "AttentionTileArgs.keys"
  DeviceRange range;
  std::uint64_t expected_bytes;
  std::uint64_t alignment;
  Factor factors[4];
  int num_factors;
};

std::string Formula(const NamedRange& r) {
  std::string f;
  for (int i = 0; i < r.num_factors; ++i) {
    if (i > 0) f += " * ";
    f += r.factors[i].name;
    f += "(" + Num(r.factors[i].value) + ")";
  }
  return f;
}

Status CheckRange(const NamedRange& r, std::uint64_t arena_bytes) {
  if (r.range.bytes != r.expected_bytes) {
    return Status::InvalidArgument(std::string(r.name) + ".bytes=" + Num(r.range.bytes) +
                                   " but the layout needs " + Formula(r) + " = " +
                                   Num(r.expected_bytes));
  }
  std::uint64_t end = 0;
  if (__builtin_add_overflow(r.range.offset, r.range.bytes, &end) || end > arena_bytes) {
    return Status::InvalidArgument(std::string(r.name) + " [offset=" + Num(r.range.offset) +
                                   ", bytes=" + Num(r.range.bytes) +
                                   ") lies outside the arena of " + Num(arena_bytes) + " bytes");
  }
  if (r.range.bytes != 0 && r.range.offset % r.alignment != 0) {
    return Status::InvalidArgument(std::string(r.name) + ".offset=" + Num(r.range.offset) +
                                   " is not a multiple of its element size " + Num(r.alignment));
  }
  return Status::OK();
}

// REQUIRES: both ranges passed CheckRange (their ends do not overflow).
bool Overlap(const DeviceRange& a, const DeviceRange& b) {
  if (a.bytes == 0 || b.bytes == 0) return false;
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

Status CheckDisjoint(const NamedRange& written, const NamedRange& other) {
  if (!Overlap(written.range, other.range)) return Status::OK();
  return Status::InvalidArgument(std::string(written.name) + " [" + Num(written.range.offset) +
                                 ", +" + Num(written.range.bytes) + ") overlaps " +
                                 std::string(other.name) + " [" + Num(other.range.offset) + ", +" +
                                 Num(other.range.bytes) + "): kernels are not in-place");
}

// Checks every range, then that each written range (the first `num_written`)
// overlaps nothing else.
template <std::size_t N>
Status CheckRanges(const NamedRange (&ranges)[N], std::size_t num_written,
                   std::uint64_t arena_bytes) {
  for (const NamedRange& r : ranges) KVF_RETURN_IF_ERROR(CheckRange(r, arena_bytes));
  for (std::size_t w = 0; w < num_written; ++w) {
    for (std::size_t i = 0; i < N; ++i) {
      if (i != w) KVF_RETURN_IF_ERROR(CheckDisjoint(ranges[w], ranges[i]));
    }
  }
  return Status::OK();
}

// The rules every attention kernel's shape follows (the dtype is the
// caller's): heads, head_dim and a finite scale. `args` names the struct.
Status CheckHeadsAndScale(const char* args, const AttentionShape& s, float scale) {
  if (s.num_kv_heads == 0) {
    return Status::InvalidArgument(std::string(args) + ".shape.num_kv_heads=0: must be > 0");
  }
  if (s.num_q_heads == 0 || s.num_q_heads % s.num_kv_heads != 0) {
    return Status::InvalidArgument(
        std::string(args) + ".shape.num_q_heads=" + Num(s.num_q_heads) +
        " must be a positive multiple of num_kv_heads=" + Num(s.num_kv_heads));
  }
  if (s.head_dim == 0 || s.head_dim > kMaxHeadDim) {
    return Status::InvalidArgument(std::string(args) + ".shape.head_dim=" + Num(s.head_dim) +
                                   " must be in [1, " + Num(kMaxHeadDim) + "]");
  }
  if (!std::isfinite(scale)) {
    return Status::InvalidArgument(std::string(args) + ".scale=" + std::to_string(scale) +
                                   " must be finite");
  }
  return Status::OK();
}

}  // namespace

std::uint64_t CompactHalfBytes(std::uint32_t tokens, std::uint32_t kv_heads,
                               std::uint32_t head_dim) {
  const std::uint64_t elements = std::uint64_t{tokens} * kv_heads * head_dim;
  const std::uint64_t scales =
      std::max(std::uint64_t{kv_heads} * head_dim, std::uint64_t{tokens} * kv_heads);
  return (elements + 2 * scales + 7) / 8 * 8;
}

Status ValidateAttentionTile(const AttentionTileArgs& args, std::uint64_t arena_bytes) {
  const AttentionShape& s = args.shape;
  if (s.dtype != KvDtype::kFp16 && s.dtype != KvDtype::kBf16 && s.dtype != KvDtype::kFp32) {
    return Status::InvalidArgument(
        "AttentionTileArgs.shape.dtype=" + std::string(KvDtypeName(s.dtype)) + " (" +
        Num(static_cast<std::uint32_t>(s.dtype)) + ") is not supported: fp16, bf16 or fp32");
  }
  KVF_RETURN_IF_ERROR(CheckHeadsAndScale("AttentionTileArgs", s, args.scale));
  const std::uint64_t dsize = KvDtypeSize(s.dtype);
  std::uint64_t q_elems = 0, kv_row = 0, kv_elems = 0, kv_bytes = 0, q_bytes = 0;
  KVF_RETURN_IF_ERROR(CheckedMul(s.num_q_heads, s.head_dim, "num_q_heads * head_dim", &q_elems));
  KVF_RETURN_IF_ERROR(CheckedMul(q_elems, 4, "num_q_heads * head_dim * 4", &q_bytes));
  KVF_RETURN_IF_ERROR(CheckedMul(s.num_kv_heads, s.head_dim, "num_kv_heads * head_dim", &kv_row));
  KVF_RETURN_IF_ERROR(
      CheckedMul(args.tokens, kv_row, "tokens * num_kv_heads * head_dim", &kv_elems));
  KVF_RETURN_IF_ERROR(
      CheckedMul(kv_elems, dsize, "tokens * num_kv_heads * head_dim * dtype_size", &kv_bytes));
  const Factor q{"num_q_heads", s.num_q_heads}, kv{"num_kv_heads", s.num_kv_heads},
      hd{"head_dim", s.head_dim}, f32{"sizeof(float)", 4}, t{"tokens", args.tokens},
      ds{"dtype_size", dsize};
  const NamedRange ranges[] = {
      {"AttentionTileArgs.output", args.output, q_bytes, 4, {q, hd, f32}, 3},
      {"AttentionTileArgs.lse", args.lse, std::uint64_t{s.num_q_heads} * 4, 4, {q, f32}, 2},
      {"AttentionTileArgs.query", args.query, q_bytes, 4, {q, hd, f32}, 3},
      {"AttentionTileArgs.keys", args.keys, kv_bytes, dsize, {t, kv, hd, ds}, 4},
      {"AttentionTileArgs.values", args.values, kv_bytes, dsize, {t, kv, hd, ds}, 4},
  };
  return CheckRanges(ranges, 2, arena_bytes);
}

Status ValidateCompactAttentionTile(const CompactAttentionTileArgs& args,
                                    std::uint64_t arena_bytes) {
  const AttentionShape& s = args.shape;
  if (s.dtype != KvDtype::kInt8) {
    return Status::InvalidArgument(
        "CompactAttentionTileArgs.shape.dtype=" + std::string(KvDtypeName(s.dtype)) +
        ": a compact tile's codes are int8");
  }
  KVF_RETURN_IF_ERROR(CheckHeadsAndScale("CompactAttentionTileArgs", s, args.scale));
  const std::uint64_t tile_tokens = std::uint64_t{args.blocks} * args.block_tokens;
  if (args.block_tokens == 0 || args.blocks == 0 || tile_tokens > kMaxCompactTileTokens) {
    return Status::InvalidArgument("CompactAttentionTileArgs.blocks=" + Num(args.blocks) +
                                   " * block_tokens=" + Num(args.block_tokens) +
                                   " must be in [1, kMaxCompactTileTokens=" +
                                   Num(kMaxCompactTileTokens) + "], each factor > 0");
  }
  // Bounded above: tokens <= 2^12 and head_dim <= 2^9, so the half fits 64 bits.
  const std::uint64_t half = CompactHalfBytes(args.block_tokens, s.num_kv_heads, s.head_dim);
  std::uint64_t q_elems = 0, q_bytes = 0, slices = 0;
  KVF_RETURN_IF_ERROR(CheckedMul(s.num_q_heads, s.head_dim, "num_q_heads * head_dim", &q_elems));
  KVF_RETURN_IF_ERROR(CheckedMul(q_elems, 4, "num_q_heads * head_dim * 4", &q_bytes));
  KVF_RETURN_IF_ERROR(
      CheckedMul(std::uint64_t{args.blocks} * 2, half, "blocks * 2 * CompactHalfBytes", &slices));
  const Factor q{"num_q_heads", s.num_q_heads}, hd{"head_dim", s.head_dim}, f32{"sizeof(float)", 4},
      b{"blocks", args.blocks}, two{"halves", 2},
      h{"CompactHalfBytes(block_tokens, num_kv_heads, head_dim)", half};
  const NamedRange ranges[] = {
      {"CompactAttentionTileArgs.output", args.output, q_bytes, 4, {q, hd, f32}, 3},
      {"CompactAttentionTileArgs.lse", args.lse, std::uint64_t{s.num_q_heads} * 4, 4, {q, f32}, 2},
      {"CompactAttentionTileArgs.query", args.query, q_bytes, 4, {q, hd, f32}, 3},
      {"CompactAttentionTileArgs.slices", args.slices, slices, 8, {b, two, h}, 3},
  };
  return CheckRanges(ranges, 2, arena_bytes);
}

Status ValidateMergeStates(const MergeStatesArgs& args, std::uint64_t arena_bytes) {
  if (args.num_heads == 0 || args.head_dim == 0) {
    return Status::InvalidArgument("MergeStatesArgs.num_heads=" + Num(args.num_heads) +
                                   " and head_dim=" + Num(args.head_dim) + " must be > 0");
  }
  std::uint64_t row = 0, row_bytes = 0, all = 0, lses = 0;
  KVF_RETURN_IF_ERROR(CheckedMul(args.num_heads, args.head_dim, "num_heads * head_dim", &row));
  KVF_RETURN_IF_ERROR(CheckedMul(row, 4, "num_heads * head_dim * 4", &row_bytes));
  KVF_RETURN_IF_ERROR(
      CheckedMul(args.num_states, row_bytes, "num_states * num_heads * head_dim * 4", &all));
  KVF_RETURN_IF_ERROR(CheckedMul(args.num_states, std::uint64_t{args.num_heads} * 4,
                                 "num_states * num_heads * 4", &lses));
  const Factor n{"num_states", args.num_states}, h{"num_heads", args.num_heads},
      hd{"head_dim", args.head_dim}, f32{"sizeof(float)", 4};
  const NamedRange ranges[] = {
      {"MergeStatesArgs.output", args.output, row_bytes, 4, {h, hd, f32}, 3},
      {"MergeStatesArgs.lse", args.lse, std::uint64_t{args.num_heads} * 4, 4, {h, f32}, 2},
      {"MergeStatesArgs.outputs", args.outputs, all, 4, {n, h, hd, f32}, 4},
      {"MergeStatesArgs.lses", args.lses, lses, 4, {n, h, f32}, 3},
  };
  return CheckRanges(ranges, 2, arena_bytes);
}

Status ValidateGatherPages(const GatherPagesArgs& args, std::uint64_t arena_bytes) {
  if (args.page_bytes == 0) {
    return Status::InvalidArgument("GatherPagesArgs.page_bytes=0: must be > 0");
  }
  std::uint64_t dest = 0;
  KVF_RETURN_IF_ERROR(CheckedMul(args.num_pages, args.page_bytes, "num_pages * page_bytes", &dest));
  const Factor n{"num_pages", args.num_pages}, pb{"page_bytes", args.page_bytes},
      u64{"sizeof(uint64_t)", 8};
  const NamedRange ranges[] = {
      {"GatherPagesArgs.destination", args.destination, dest, 1, {n, pb}, 2},
      {"GatherPagesArgs.page_offsets",
       args.page_offsets,
       std::uint64_t{args.num_pages} * 8,
       8,
       {n, u64},
       2},
  };
  return CheckRanges(ranges, 1, arena_bytes);
}

Status ValidateGatherSource(const GatherPagesArgs& args, std::uint32_t index,
                            std::uint64_t page_offset, std::uint64_t arena_bytes) {
  std::uint64_t end = 0;
  if (__builtin_add_overflow(page_offset, args.page_bytes, &end) || end > arena_bytes) {
    return Status::InvalidArgument("GatherPagesArgs page " + Num(index) + " [offset=" +
                                   Num(page_offset) + ", bytes=" + Num(args.page_bytes) +
                                   ") lies outside the arena of " + Num(arena_bytes) + " bytes");
  }
  const DeviceRange page{page_offset, args.page_bytes};
  for (const auto& [name, other] :
       {std::pair{"destination", args.destination}, std::pair{"page_offsets", args.page_offsets}}) {
    if (Overlap(page, other)) {
      return Status::InvalidArgument("GatherPagesArgs page " + Num(index) + " [" +
                                     Num(page_offset) + ", +" + Num(args.page_bytes) +
                                     ") overlaps GatherPagesArgs." + name + " [" +
                                     Num(other.offset) + ", +" + Num(other.bytes) + ")");
    }
  }
  return Status::OK();
}

}  // namespace kvfabric::gpu
