// Sessions that survive (`veloxquant serve --session-dir DIR`): at the end of every chat turn the
// session's state (its conversation, the tokens sampled but not yet fed, and its compressed
// cache, ModelCache::save_state) is written to DIR as one file, named by a hash of what a later
// request must repeat to continue it: the model, the chat template, the method spec and the
// messages so far (the last one the reply). A session dropped from memory for room is then
// "spilled", not lost; a restarted server, or another replica sharing DIR, restores it when a
// request extends that conversation; and because every turn leaves its own file, a request that
// edits the last reply resumes from the turn before it (a snapshot at each turn boundary).
//
// File format (little-endian, version 1):
//   8 bytes  "VQSESS01"
//   u32      header length H, then H bytes of JSON: {"format":1, "model":..., "template":...,
//            "spec":..., "history":[{"role":..,"content":..},...], "tail":[ids...],
//            "ended_with_eot":bool, "tokens_seen":n, "state_bytes":n}
//   u64      FNV-1a 64 of the header bytes
//   u64      cache state length S, then S bytes of ModelCache::save_state (self-checksummed)
// Nothing follows. Files are written to a temporary name in DIR, flushed, then renamed: a reader
// (this server or another) sees a whole file or none.
//
// DIR is bounded by --session-dir-bytes: after each write the oldest files (by modification
// time) are removed until the files fit. Writes run on the store's own thread; the scheduler
// only copies the state (save_state) at the end of a turn.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/run/chat_template.h"

namespace vq::engine {
class Model;
class Tokenizer;
}  // namespace vq::engine

namespace vq::serve {

// What a session file holds besides the cache.
struct SessionRecord {
  std::string spec;                       // the method spec, canonical (CacheConfig::spec(true))
  std::vector<engine::Message> history;   // the conversation; its last, the reply generated
  std::vector<std::int32_t> tail;         // sampled, not yet fed
  bool ended_with_eot = false;
  std::int64_t tokens_seen = 0;           // positions the cache holds
  std::vector<std::uint8_t> state;        // ModelCache::save_state
};

// 64-bit FNV-1a.
std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull);

// An identity of the model and tokenizer a session file belongs to (hex): the model's
// configuration, the checkpoint file's size and a hash of sampled blocks of it, the tokenizer's
// vocabulary size and pieces. Two servers of the same files agree; another model, checkpoint or
// tokenizer gives another identity (so its files are never looked up).
std::string model_identity(const engine::Model& model, const engine::Tokenizer& tokenizer);

// The file bytes of `r`, and their parse. decode_session throws Error(kFileError) naming `path`
// for anything but a whole, well-formed version-1 file (bad magic, unknown format, truncated,
// header checksum, malformed JSON, lengths that do not add up); the cache state inside is
// checked by ModelCache::load_state.
std::vector<std::uint8_t> encode_session(const SessionRecord& r, const std::string& model_id,
                                         const std::string& template_name);
SessionRecord decode_session(const std::vector<std::uint8_t>& bytes, const std::string& path,
                             const std::string& model_id, const std::string& template_name);

struct SessionStoreStats {
  std::int64_t files = 0, bytes = 0;        // in DIR now (as this server last counted)
  std::int64_t writes = 0, write_errors = 0;
  std::int64_t skipped = 0;                 // turns not written: the writer was too far behind,
                                            // or one file alone passes --session-dir-bytes
  std::int64_t removed = 0;                 // files removed to keep DIR within its bound
};

class SessionStore {
 public:
  // Creates DIR when missing; throws Error(kInvalidArgument) naming --session-dir when it is not
  // a directory this process can write, or --session-dir-bytes < 1. Counts the files already
  // there (a restart picks them up) and removes temporary files older than an hour.
  SessionStore(std::string dir, std::int64_t max_bytes, std::string model_id,
               std::string template_name);
  ~SessionStore();  // writes what is queued, then stops
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // The file a conversation with these messages (its last the reply) is kept in.
  std::string path_of(const std::string& spec, const std::vector<engine::Message>& history) const;
  // Queues the record for writing (the writer thread encodes and writes it), then calls `done`
  // on the writer thread once the file is durable (or its write failed). False when the writer
  // is too far behind (more than a quarter of --session-dir-bytes queued): the turn is not
  // written (counted as skipped) and `done` is not called.
  bool put(SessionRecord r, std::function<void()> done = {});
  // The saved turns of a conversation that `messages` extend, latest first: (file, k) for each
  // assistant message m[k-1] (k < messages.size()) whose file exists. Only looks the files up
  // (stat), reads nothing.
  std::vector<std::pair<std::string, std::size_t>> candidates(
      const std::string& spec, const std::vector<engine::Message>& messages) const;
  // Reads and parses the file of (spec, history): nullopt when it is gone (removed meanwhile) or
  // holds another conversation (a hash collision); Error(kFileError) naming it when it is
  // damaged (the caller removes it).
  std::optional<SessionRecord> read(const std::string& path, const std::string& spec,
                                    const std::vector<engine::Message>& history) const;
  SessionStoreStats stats();

 private:
  void loop();
  void write_one(const std::string& path, const std::vector<std::uint8_t>& bytes);
  void enforce_bound();  // the writer thread, without mu_: recounts DIR, removes the oldest past the bound
  std::string dir_;
  std::int64_t max_bytes_;
  std::string model_id_, template_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<SessionRecord, std::function<void()>>> queue_;
  std::int64_t queued_bytes_ = 0;
  bool stop_ = false;
  SessionStoreStats stats_;
  std::uint64_t tmp_counter_ = 0;
  std::thread thread_;
};

}  // namespace vq::serve
