#include "proto/model_proto.h"

#include <algorithm>
#include <cstdint>

namespace kvfabric {

v1::DType KvDtypeToProto(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
      return v1::DTYPE_FP16;
    case KvDtype::kBf16:
      return v1::DTYPE_BF16;
    case KvDtype::kFp32:
      return v1::DTYPE_FP32;
    case KvDtype::kFp8E4M3:
      return v1::DTYPE_FP8_E4M3;
    case KvDtype::kInt8:
      return v1::DTYPE_INT8;
  }
  return v1::DTYPE_UNSPECIFIED;
}

void FingerprintToProto(const ModelFingerprint& fp, v1::ModelFingerprint* out) {
  out->set_model_id(fp.model_id);
  out->set_first_layer(fp.first_layer);
  out->set_layer_count(fp.layer_count);
  out->set_dtype(KvDtypeToProto(fp.dtype));
  out->set_kv_heads(fp.kv_heads);
  out->set_head_dim(fp.head_dim);
  out->set_tokens_per_block(fp.tokens_per_block);
  out->set_tp_rank(fp.tp_rank);
  out->set_tp_size(fp.tp_size);
  out->set_layout_version(fp.layout_version);
  // Version 1 is written as 0, byte for byte what a sender that predates v2
  // writes; the v2 fields are then all at their defaults (Validate), so unset.
  out->set_key_version(fp.key_version == kBlockKeyVersion1 ? 0 : fp.key_version);
  out->set_weights_revision(fp.weights_revision);
  out->set_quantization(fp.quantization);
  out->set_kv_scale_scheme(fp.kv_scale_scheme);
  const bool has_scales = std::any_of(fp.kv_scales_digest.begin(), fp.kv_scales_digest.end(),
                                      [](std::uint8_t b) { return b != 0; });
  if (has_scales) {
    out->set_kv_scales_digest(reinterpret_cast<const char*>(fp.kv_scales_digest.data()),
                              fp.kv_scales_digest.size());
  } else {
    out->clear_kv_scales_digest();
  }
  out->set_rope(fp.rope);
  out->set_v_head_dim(fp.v_head_dim);
  out->set_vocab_size(fp.vocab_size);
}

}  // namespace kvfabric
