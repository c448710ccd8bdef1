#include "nvme/io_queue.hpp"

#include <errno.h>

#include <algorithm>

namespace tier::nvme {

IoQueue::IoQueue(std::unique_ptr<IoBackend> backend, IoQueueOptions o)
    : backend_(std::move(backend)), opts_(o) {
  opts_.request_size = std::clamp<uint32_t>(opts_.request_size, 4096, 1u << 30);
}

IoQueue::~IoQueue() { drain(); }

void IoQueue::submit(IoOp op, int file, uint64_t offset, std::byte* buf, uint64_t len, Done done) {
  uint32_t t;
  if (!free_transfers_.empty()) {
    t = free_transfers_.back();
    free_transfers_.pop_back();
  } else {
    t = static_cast<uint32_t>(transfers_.size());
    transfers_.emplace_back();
  }
  Transfer& tr = transfers_[t];
  tr = Transfer{};
  bool sync = op == IoOp::kSync;
  tr.op = op;
  tr.file = file;
  tr.offset = sync ? 0 : offset;
  tr.len = sync ? 0 : len;
  tr.buf = sync ? nullptr : buf;
  tr.done = std::move(done);
  tr.live = true;
  ++live_;
  if (tr.len == 0 && !sync) {
    maybe_finish(t);
    return;
  }
  // A sync goes ahead of queued transfers: the writes it covers are done, and spills wait for
  // it, while the transfers behind it have only just been queued.
  if (sync) backlog_.push_front(t);
  else backlog_.push_back(t);
  pump();
}

void IoQueue::issue(Chunk c) {
  uint32_t idx;
  if (!free_chunks_.empty()) {
    idx = free_chunks_.back();
    free_chunks_.pop_back();
  } else {
    idx = static_cast<uint32_t>(chunks_.size());
    chunks_.emplace_back();
  }
  c.live = true;
  chunks_[idx] = c;
  const Transfer& tr = transfers_[c.transfer];
  IoRequest r;
  r.op = tr.op;
  r.file = tr.file;
  r.offset = tr.offset + c.pos;
  r.buf = tr.buf + c.pos;
  r.len = c.len;
  r.user_data = idx;
  backend_->submit(r);
  ++counters_.requests;
}

void IoQueue::pump() {
  size_t qd = backend_->queue_depth();
  bool any = false;
  while (backend_->in_flight() < qd) {
    if (!retries_.empty()) {
      Chunk c = retries_.front();
      retries_.pop_front();
      issue(c);
      any = true;
      continue;
    }
    if (backlog_.empty()) break;
    uint32_t t = backlog_.front();
    Transfer& tr = transfers_[t];
    if (tr.error != 0 || fully_issued(tr)) {  // failed transfers issue nothing more
      backlog_.pop_front();
      maybe_finish(t);
      continue;
    }
    Chunk c;
    c.transfer = t;
    if (tr.op == IoOp::kSync) {  // one request, no bytes
      tr.sync_issued = true;
      ++tr.outstanding;
      backlog_.pop_front();
      issue(c);
      any = true;
      continue;
    }
    c.pos = tr.issued;
    c.len = static_cast<uint32_t>(std::min<uint64_t>(opts_.request_size, tr.len - tr.issued));
    tr.issued += c.len;
    ++tr.outstanding;
    if (tr.issued >= tr.len) backlog_.pop_front();
    issue(c);
    any = true;
  }
  if (any) backend_->flush();
}

void IoQueue::on_completion(const IoCompletion& comp) {
  Chunk c = chunks_.at(comp.user_data);
  chunks_[comp.user_data].live = false;
  free_chunks_.push_back(static_cast<uint32_t>(comp.user_data));
  Transfer& tr = transfers_[c.transfer];
  int32_t res = comp.result;
  bool zero = res == 0 && c.len > 0;
  if (res == -EAGAIN || (zero && tr.op == IoOp::kWrite)) {
    if (++c.tries <= opts_.max_retries && tr.error == 0) {
      ++counters_.eagain_retries;
      retries_.push_back(c);
      return;
    }
    res = zero ? -EIO : -EAGAIN;
  } else if (zero) {
    res = -EIO;  // a read at or past the end of the file
  }
  if (res < 0) {
    if (tr.error == 0) tr.error = res;
  } else {
    if (tr.op == IoOp::kRead) counters_.bytes_read += static_cast<uint64_t>(res);
    else if (tr.op == IoOp::kWrite) counters_.bytes_written += static_cast<uint64_t>(res);
    else ++counters_.syncs;
    if (static_cast<uint32_t>(res) < c.len && tr.error == 0) {
      ++counters_.short_retries;
      c.pos += static_cast<uint64_t>(res);
      c.len -= static_cast<uint32_t>(res);
      c.tries = 0;
      retries_.push_back(c);
      return;
    }
  }
  --tr.outstanding;
  maybe_finish(c.transfer);
}

void IoQueue::maybe_finish(uint32_t t) {
  Transfer& tr = transfers_[t];
  if (!tr.live || tr.outstanding != 0) return;
  if (tr.error == 0 && !fully_issued(tr)) return;
  if (tr.error != 0 && std::find(backlog_.begin(), backlog_.end(), t) != backlog_.end()) {
    backlog_.erase(std::find(backlog_.begin(), backlog_.end(), t));
  }
  ready_.emplace_back(std::move(tr.done), tr.error != 0 ? int64_t{tr.error} : int64_t(tr.len));
  tr.live = false;
  tr.done = nullptr;
  free_transfers_.push_back(t);
  --live_;
}

size_t IoQueue::poll() {
  scratch_.clear();
  backend_->reap(scratch_);
  for (const IoCompletion& c : scratch_) on_completion(c);
  pump();
  size_t n = 0;
  while (!ready_.empty()) {
    auto batch = std::move(ready_);
    ready_.clear();
    for (auto& [done, res] : batch) {
      if (done) done(res);
      ++n;
    }
  }
  return n;
}

void IoQueue::wait() {
  if (poll() > 0 || idle()) return;
  while (!idle()) {
    wait_readable(backend_->event_fd(), 1000);
    if (poll() > 0) return;
  }
}

void IoQueue::drain() {
  while (!idle()) wait();
  poll();
}

}  // namespace tier::nvme
