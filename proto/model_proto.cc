#include "proto/model_proto.h"

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
}

}  // namespace kvfabric
