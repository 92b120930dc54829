#include "proto/wire_limits.h"

#include "core/block_format.h"
#include "core/block_key.h"
#include "core/model_fingerprint.h"

namespace kvfabric {

v1::Limits DefaultLimits() {
  v1::Limits l;
  l.set_max_keys_per_batch(kMaxKeysPerBatch);
  l.set_max_chain_blocks(kMaxChainBlocks);
  l.set_max_block_bytes(kMaxBlockPayloadBytes);
  l.set_max_batch_payload_bytes(kMaxBatchPayloadBytes);
  l.set_max_extents_per_block(kMaxExtentsPerBlock);
  l.set_max_message_bytes(kMaxMessageBytes);
  l.set_max_request_bytes(kMaxRequestBytes);
  l.set_max_namespace_bytes(static_cast<std::uint32_t>(kMaxNamespaceBytes));
  l.set_max_model_id_bytes(static_cast<std::uint32_t>(kMaxModelIdBytes));
  l.set_max_host_id_bytes(kMaxHostIdBytes);
  l.set_max_address_bytes(kMaxAddressBytes);
  l.set_max_transport_blob_bytes(kMaxTransportBlobBytes);
  l.set_max_ttl_ms(kMaxTtlMs);
  l.set_default_ttl_ms(kDefaultTtlMs);
  l.set_max_replicas(kMaxReplicas);
  l.set_max_tokens_per_block(kMaxTokensPerBlock);
  l.set_max_explanation_bytes(kMaxExplanationBytes);
  return l;
}

}  // namespace kvfabric
