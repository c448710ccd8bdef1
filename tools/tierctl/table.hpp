// A plain-text table for tierctl's human output: columns padded to their widest cell, numeric
// columns right-aligned, two spaces between columns, a header row in capitals.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace tier::ctl {

class Table {
 public:
  // `right` lists, per column, whether it is right-aligned (sizes and counts).
  Table(std::vector<std::string> headers, std::vector<bool> right)
      : headers_(std::move(headers)), right_(std::move(right)) {
    right_.resize(headers_.size(), false);
  }
  void add(std::vector<std::string> row) {
    row.resize(headers_.size());
    rows_.push_back(std::move(row));
  }
  bool empty() const { return rows_.empty(); }
  void print(std::FILE* out = stdout, const std::string& indent = "") const {
    std::vector<size_t> w(headers_.size());
    for (size_t c = 0; c < headers_.size(); ++c) {
      w[c] = headers_[c].size();
      for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
    }
    auto line = [&](const std::vector<std::string>& cells) {
      std::string s = indent;
      for (size_t c = 0; c < cells.size(); ++c) {
        size_t pad = w[c] - cells[c].size();
        bool last = c + 1 == cells.size();
        if (right_[c]) s.append(pad, ' ');
        s += cells[c];
        if (!right_[c] && !last) s.append(pad, ' ');
        if (!last) s += "  ";
      }
      std::fprintf(out, "%s\n", s.c_str());
    };
    line(headers_);
    for (const auto& r : rows_) line(r);
  }

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace tier::ctl
