// NvmeCatalog: a small durable append-only log, kept beside the NVMe tier's
// segment files, that remembers for every demoted block what its 128-byte block
// header does not: the block's namespace (tenant), its block key and its
// token_offset. On NVMe a block's header key is its *NVMe key*, a digest of
// (tenant, block key) (CacheHostNode: internal::NvmeKeyOf), so the same block
// key in two namespaces is two NVMe blocks and two catalog entries. After a
// restart NvmeTier::Open returns the intact blocks with their headers (NVMe
// key, shape, CRC); the daemon looks each NVMe key up here to rebuild its
// (namespace, key) index.
//
// Durability rule: the daemon calls AppendBatch() for a group of blocks and
// queues their demotions only after it returned OK. AppendBatch syncs before it
// returns, so after a crash every block on NVMe has its catalog record. The
// converse does not hold (a record whose demotion never happened or was later
// removed) and is harmless: lookups are driven by the blocks the tier recovered.
//
// File format (catalog.log in the tier's directory; little-endian, encoded
// field by field):
//   file header, kCatalogFileHeaderBytes = 12:
//     [0,4)  magic "KVFC"
//     [4,6)  version (kCatalogFormatVersion = 2)
//     [6,8)  reserved, zero
//     [8,12) masked CRC32C (core/crc32c.h Mask) of bytes [0,8)
//   then records, back to back:
//     [0,4)  masked CRC32C of bytes [4, 8 + body_bytes): the length and the body
//     [4,8)  body_bytes, in [kCatalogRecordFixedBodyBytes,
//            kCatalogRecordFixedBodyBytes + kMaxNamespaceBytes]
//     body:
//       [0,32)  NVMe key (the BlockDigest in the block's header on NVMe)
//       [32,64) block key (the client's BlockKey)
//       [64,72) token_offset
//       [72,74) tenant_bytes; must equal body_bytes - 74 (so <= kMaxNamespaceBytes)
//       [74,..) tenant, raw bytes
// Version 1 (before NVMe keys were per namespace: key, token_offset, tenant)
// is not read: its blocks could not be told apart by namespace. Open replaces
// such a log with an empty version-2 one (logged, counted in
// CatalogRecovery::dropped_v1_records), and the blocks it described are then
// dropped by the daemon's recovery as blocks without a record.
//
// Recovery (Open): the last intact record of a key wins. Damaged bytes (a
// record that is incomplete, has a length outside the bounds above, or fails
// its CRC) are never trusted for their length: recovery looks for the next
// position that holds a record whose CRC holds. If there is one, the damaged
// bytes in between are one corrupt region, counted and skipped; if there is
// none, they are the torn tail of an interrupted append, counted and truncated
// away. So a torn or bit-flipped last record is a torn tail, and a bit flip
// anywhere in a middle record (its length included) costs that record only. A
// record whose CRC holds but whose fields disagree is counted corrupt and
// skipped by its length. No size read from the file is used to allocate. A
// file header that is missing, damaged or of another version is
// FailedPrecondition and the file is left alone.
//
// Memory: one entry per distinct key (48 bytes plus hash-map overhead), with
// tenant names interned once each (as many as the daemon has namespaces). Keys only leave the map
// through Forget() and Compact(), so between compactions the map holds every key demoted since the
// last one; with the daemon calling Compact() with the tier's recovered keys at start-up and
// Forget() when the tier removes a block, it is bounded by the NVMe tier's block count
// (capacity_bytes / smallest block). The file grows by one record (50 + tenant bytes) per demotion
// until the next Compact(); stats() reports records against live entries so the daemon can decide
// when to rewrite it.
//
// Ownership: the catalog owns its file. The Env is borrowed and must outlive
// the catalog.
//
// Thread safety: every public method may be called from any thread; one mutex
// serialises them, including the I/O of AppendBatch and Compact (a Compact
// holds off appends and lookups while it rewrites the file).
#ifndef KVFABRIC_SERVER_CACHE_HOST_NVME_CATALOG_H_
#define KVFABRIC_SERVER_CACHE_HOST_NVME_CATALOG_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/block_format.h"
#include "core/block_key.h"
#include "core/env.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::cache_host {

// Names of the log and of the temporary file Compact() writes, in the tier's
// directory. Neither parses as a segment file name, so NvmeTier ignores both.
inline constexpr char kCatalogFileName[] = "catalog.log";
inline constexpr char kCatalogTempFileName[] = "catalog.log.tmp";

inline constexpr std::array<std::uint8_t, 4> kCatalogMagic = {'K', 'V', 'F', 'C'};
// The format version this build writes, and the only one it reads.
inline constexpr std::uint16_t kCatalogFormatVersion = 2;
inline constexpr std::size_t kCatalogFileHeaderBytes = 12;
// Masked CRC and body length in front of every record body.
inline constexpr std::size_t kCatalogRecordPrefixBytes = 8;
// NVMe key, block key, token_offset and tenant length: the body of a record
// with an empty tenant.
inline constexpr std::size_t kCatalogRecordFixedBodyBytes = 74;
inline constexpr std::size_t kCatalogMaxRecordBodyBytes =
    kCatalogRecordFixedBodyBytes + kMaxNamespaceBytes;

// What the catalog records about one demoted block.
struct CatalogEntry {
  BlockDigest key{};               // its NVMe key (BlockHeader::key on NVMe): the catalog's key
  BlockDigest block_key{};         // its BlockKey bytes, as the client named it
  std::string tenant;              // its Namespace::tenant, at most kMaxNamespaceBytes
  std::uint64_t token_offset = 0;  // tokens before the block in its context

  friend bool operator==(const CatalogEntry&, const CatalogEntry&) = default;
};

// Bytes one record of `entry` occupies in the log: prefix, fixed body, tenant.
inline std::uint64_t CatalogRecordBytes(const CatalogEntry& entry) {
  return kCatalogRecordPrefixBytes + kCatalogRecordFixedBodyBytes + entry.tenant.size();
}

// What Open() found.
struct CatalogRecovery {
  bool created = false;       // there was no catalog.log: started with an empty one
  bool deleted_temp = false;  // a catalog.log.tmp left by an interrupted Compact was deleted
  std::uint64_t records = 0;  // intact records read
  std::uint64_t entries = 0;  // distinct keys among them (last record wins)
  // Damaged regions skipped in the middle of the log (each held at least one
  // record), plus records whose CRC held but whose fields disagreed.
  std::uint64_t corrupt_records = 0;
  std::uint64_t torn_records = 0;     // torn tails truncated away (0 or 1)
  std::uint64_t truncated_bytes = 0;  // bytes the truncation removed
  std::uint64_t file_bytes = 0;       // size of catalog.log after recovery
  // A version-1 log was replaced by an empty one; its size in bytes.
  std::uint64_t dropped_v1_bytes = 0;
};

// A snapshot; see NvmeCatalog::stats().
struct CatalogStats {
  std::uint64_t records = 0;           // intact records in catalog.log (live or superseded)
  std::uint64_t file_bytes = 0;        // size of catalog.log
  std::uint64_t live_entries = 0;      // distinct keys in memory
  std::uint64_t tenants = 0;           // distinct tenant names interned
  std::uint64_t batches = 0;           // AppendBatch calls that synced records, since Open
  std::uint64_t appended_records = 0;  // records they appended
  std::uint64_t failed_batches = 0;    // AppendBatch calls that failed
  std::uint64_t compactions = 0;       // Compact calls that replaced the file
};

class NvmeCatalog {
 public:
  // Opens `dir`/catalog.log (creating `dir` if missing; its parent must exist),
  // deleting a leftover catalog.log.tmp first, and recovers it as the class
  // comment describes; a torn tail is truncated, and the file is synced so that
  // what recovery returned stays durable. A missing log is created, with its
  // header, atomically. Fills *report when report != nullptr. Logs one line.
  // Errors: FailedPrecondition for a bad file header (the file is not
  // touched); I/O errors.
  // REQUIRES: env != nullptr and outlives the catalog.
  static StatusOr<std::unique_ptr<NvmeCatalog>> Open(Env* env, const std::string& dir,
                                                     CatalogRecovery* report);

  // Closes the file. Everything AppendBatch acknowledged is already durable.
  ~NvmeCatalog();
  NvmeCatalog(const NvmeCatalog&) = delete;
  NvmeCatalog& operator=(const NvmeCatalog&) = delete;

  // Appends one record per entry, in order, with a single write, then syncs
  // once. When it returns OK the records are durable and Find() returns them
  // (a later entry of the same key, in this batch or a later one, wins). An
  // empty batch does nothing. Errors: InvalidArgument, before any I/O, for a
  // tenant longer than kMaxNamespaceBytes; I/O errors, after which the file
  // is rolled back to its previous end and none of the batch's entries are
  // added. If even that rollback fails, the file is in an unknown state and
  // every later AppendBatch fails (FailedPrecondition, naming both errors)
  // until the catalog is reopened or a Compact() rewrites the file.
  Status AppendBatch(std::span<const CatalogEntry> entries);

  // The latest entry recorded for `key`, if any.
  std::optional<CatalogEntry> Find(const BlockDigest& key) const;

  // Drops `key` from memory (not from the file; a record without a block is
  // harmless and the next Compact leaves it out). Returns whether it was
  // there. Call when the tier has removed the key's block, to keep memory
  // bounded by the tier's block count.
  // REQUIRES: no block of `key` is on the NVMe tier or queued for demotion.
  bool Forget(const BlockDigest& key);

  // Rewrites the log with only the latest record of each key in `live_keys`
  // (keys the catalog does not know are ignored; duplicates are fine) and drops
  // every other key from memory. Writes catalog.log.tmp, syncs it, renames it
  // over catalog.log and syncs the directory; a crash at any point leaves
  // either the old log or the new one, both valid. On an error before the
  // rename nothing changes (the temporary file is deleted, best effort). If
  // only the directory sync fails, the new log is in place and the next
  // AppendBatch retries the sync before it writes. Logs one line.
  Status Compact(std::span<const BlockDigest> live_keys);

  // Compact() keeping every key now in memory: reclaims the records of
  // superseded and forgotten keys.
  Status Compact();

  CatalogStats stats() const;

  // False once a failed append could not be rolled back (the file is in an
  // unknown state and appends fail) until a Compact() rewrites it.
  bool healthy() const;

  // Appends `entries` exactly as AppendBatch does but skips the sync: what a
  // process that dies between the write and the sync leaves behind. For crash
  // tests only.
  Status TEST_AppendBatchWithoutSync(std::span<const CatalogEntry> entries);

 private:
  struct DigestHash {
    std::size_t operator()(const BlockDigest& key) const noexcept;
  };
  // One key's latest entry, with its tenant interned in tenants_.
  struct Slot {
    std::uint32_t tenant = 0;  // index into tenants_
    std::uint64_t token_offset = 0;
    BlockDigest block_key{};
  };
  using SlotMap = std::unordered_map<BlockDigest, Slot, DigestHash>;

  NvmeCatalog(Env* env, std::string dir);

  // Reads the open log (file_), fills the map and *report, truncates a torn
  // tail and syncs. Called by Open only.
  Status Recover(CatalogRecovery* report) KVF_REQUIRES(mu_);
  Status AppendLocked(std::span<const CatalogEntry> entries, bool sync) KVF_REQUIRES(mu_);
  // Writes `keep` (with its tenants) to catalog.log.tmp and renames it into
  // place; on success replaces the map, the tenant table and file_.
  Status RewriteLocked(SlotMap keep) KVF_REQUIRES(mu_);
  std::uint32_t InternTenantLocked(const std::string& tenant) KVF_REQUIRES(mu_);
  CatalogEntry EntryLocked(const BlockDigest& key, const Slot& slot) const KVF_REQUIRES(mu_);

  Env* const env_;
  const std::string dir_;
  const std::string path_;       // dir_/catalog.log
  const std::string temp_path_;  // dir_/catalog.log.tmp

  mutable Mutex mu_;
  std::unique_ptr<RandomRWFile> file_ KVF_GUARDED_BY(mu_);  // null only after a failed reopen
  std::uint64_t end_ KVF_GUARDED_BY(mu_) = 0;               // bytes of valid log, the append offset
  // Non-OK once the file is in an unknown state; returned by every later
  // AppendBatch and Compact.
  Status broken_ KVF_GUARDED_BY(mu_);
  bool dir_sync_pending_ KVF_GUARDED_BY(mu_) = false;  // a Compact's rename is not yet durable
  SlotMap entries_ KVF_GUARDED_BY(mu_);
  std::vector<std::string> tenants_ KVF_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::uint32_t> tenant_ids_ KVF_GUARDED_BY(mu_);
  CatalogStats stats_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_NVME_CATALOG_H_
