// Reads the IDX files that MNIST and Fashion-MNIST ship in (gzip-compressed or plain) into a
// small in-memory dataset for the training race. Needs zlib: target cadence::train.
#pragma once

#include <cadence/core/error.hpp>

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace cadence::train {

/// The contents of one IDX file of unsigned bytes (data type 0x08, the only one the image
/// datasets use): its dimensions, outermost first, and the values in row-major order.
struct idx_array {
  std::vector<std::size_t> dims;
  std::vector<std::uint8_t> data;
};

/// Labelled images: image i is images[i * features() .. (i + 1) * features()), row-major,
/// scaled to [0, 1]; labels[i] < classes.
struct dataset {
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t classes = 10;

  std::size_t size() const noexcept { return labels.size(); }
  std::size_t features() const noexcept { return rows * cols; }
  const float* image(std::size_t i) const noexcept { return images.data() + i * features(); }
};

/// A training set and the test set it is measured on.
struct train_test_data {
  dataset train;
  dataset test;
};

namespace detail {

class gz_file {
public:
  explicit gz_file(const std::string& path) : f_(gzopen(path.c_str(), "rb")) {}
  gz_file(const gz_file&) = delete;
  gz_file& operator=(const gz_file&) = delete;
  ~gz_file() {
    if (f_ != nullptr) gzclose(f_);
  }
  bool is_open() const noexcept { return f_ != nullptr; }
  /// Reads up to n bytes (fewer only at the end of the data); -1 on a decompression error.
  long long read(std::uint8_t* out, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const std::size_t chunk = n - got < (std::size_t{1} << 30) ? n - got : (std::size_t{1} << 30);
      const int r = gzread(f_, out + got, static_cast<unsigned>(chunk));
      if (r < 0) return -1;
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    return static_cast<long long>(got);
  }
  std::string error_text() {
    int code = 0;
    const char* m = gzerror(f_, &code);
    return m != nullptr && *m != '\0' ? m : "decompression failed";
  }

private:
  gzFile f_;
};

[[noreturn]] inline void bad_idx(const std::string& path, const std::string& what) {
  throw parse_error("cadence::train: '" + path + "': " + what);
}

inline bool file_exists(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return static_cast<bool>(f);
}

}  // namespace detail

/// Reads an IDX file of unsigned bytes; gzip-compressed files are decompressed on the fly
/// (zlib reads plain files unchanged). Throws parse_error naming the file for a file that
/// cannot be opened or decompressed, a bad magic number, an unsupported data type, a zero or
/// oversized dimension, truncated data or bytes after the data.
inline idx_array read_idx(const std::string& path) {
  detail::gz_file f(path);
  if (!f.is_open()) detail::bad_idx(path, "cannot open the file");
  std::uint8_t head[4];
  const long long got = f.read(head, 4);
  if (got < 0) detail::bad_idx(path, f.error_text());
  if (got < 4) detail::bad_idx(path, "truncated: the 4-byte magic number is missing");
  if (head[0] != 0 || head[1] != 0 || head[3] == 0 || head[3] > 4) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", head[0], head[1], head[2], head[3]);
    detail::bad_idx(path, std::string("bad magic number 0x") + hex +
                              " (an IDX file starts with 00 00, the data type and 1-4 dimensions)");
  }
  if (head[2] != 0x08) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", head[2]);
    detail::bad_idx(path, std::string("unsupported data type ") + hex + " (only unsigned bytes, 0x08)");
  }
  idx_array a;
  std::size_t total = 1;
  for (unsigned k = 0; k < head[3]; ++k) {
    std::uint8_t b[4];
    const long long r = f.read(b, 4);
    if (r < 0) detail::bad_idx(path, f.error_text());
    if (r < 4) detail::bad_idx(path, "truncated: the header ends inside dimension " + std::to_string(k));
    const std::size_t d = (std::size_t{b[0]} << 24) | (std::size_t{b[1]} << 16) | (std::size_t{b[2]} << 8) | b[3];
    if (d == 0) detail::bad_idx(path, "dimension " + std::to_string(k) + " is 0");
    if (d > (std::size_t{1} << 31) / total)
      detail::bad_idx(path, "the dimensions describe more than 2 GiB of data");
    total *= d;
    a.dims.push_back(d);
  }
  a.data.resize(total);
  const long long r = f.read(a.data.data(), total);
  if (r < 0) detail::bad_idx(path, f.error_text());
  if (static_cast<std::size_t>(r) < total)
    detail::bad_idx(path, "truncated: the header promises " + std::to_string(total) +
                              " bytes of data, the file has " + std::to_string(r));
  std::uint8_t extra;
  const long long more = f.read(&extra, 1);
  if (more < 0) detail::bad_idx(path, f.error_text());
  if (more > 0)
    detail::bad_idx(path, "trailing bytes after the " + std::to_string(total) + " bytes of data");
  return a;
}

/// Reads an image file (3 dimensions: count, rows, cols) and its label file (1 dimension)
/// into a dataset. Throws parse_error naming the file when either is malformed, when the
/// counts differ, or when a label is >= classes.
inline dataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                                std::size_t classes = 10) {
  idx_array im = read_idx(images_path);
  if (im.dims.size() != 3)
    detail::bad_idx(images_path, "expected 3 dimensions (images, rows, cols), got " + std::to_string(im.dims.size()));
  idx_array lb = read_idx(labels_path);
  if (lb.dims.size() != 1)
    detail::bad_idx(labels_path, "expected 1 dimension (labels), got " + std::to_string(lb.dims.size()));
  if (lb.dims[0] != im.dims[0])
    detail::bad_idx(labels_path, "has " + std::to_string(lb.dims[0]) + " labels but '" + images_path +
                                     "' has " + std::to_string(im.dims[0]) + " images");
  for (std::size_t i = 0; i < lb.data.size(); ++i)
    if (lb.data[i] >= classes)
      detail::bad_idx(labels_path, "label " + std::to_string(i) + " is " + std::to_string(lb.data[i]) +
                                       ", out of range for " + std::to_string(classes) + " classes");
  dataset d;
  d.rows = im.dims[1];
  d.cols = im.dims[2];
  d.classes = classes;
  d.labels = std::move(lb.data);
  d.images.resize(im.data.size());
  for (std::size_t i = 0; i < im.data.size(); ++i) d.images[i] = static_cast<float>(im.data[i]) / 255.0f;
  return d;
}

/// Loads Fashion-MNIST (or MNIST) from dir: {train,t10k}-{images-idx3,labels-idx1}-ubyte,
/// each gzip-compressed (.gz) or plain. Throws error naming the missing file (and the Debian
/// package that provides it) when a file is absent, parse_error when one is malformed.
inline train_test_data load_fashion_mnist(const std::string& dir) {
  auto find = [&](const std::string& stem) {
    const std::string base = dir.empty() || dir.back() == '/' ? dir + stem : dir + "/" + stem;
    if (detail::file_exists(base + ".gz")) return base + ".gz";
    if (detail::file_exists(base)) return base;
    throw error("cadence::train: Fashion-MNIST file '" + base + ".gz' (or '" + stem +
                "') not found; install the Debian package dataset-fashion-mnist (it puts the "
                "files in /usr/share/datasets/fashion-mnist) or point to a directory that has them");
  };
  const std::string train_images = find("train-images-idx3-ubyte");
  const std::string train_labels = find("train-labels-idx1-ubyte");
  const std::string test_images = find("t10k-images-idx3-ubyte");
  const std::string test_labels = find("t10k-labels-idx1-ubyte");
  train_test_data d;
  d.train = read_idx_dataset(train_images, train_labels);
  d.test = read_idx_dataset(test_images, test_labels);
  if (d.train.features() != d.test.features())
    detail::bad_idx(test_images, "images are " + std::to_string(d.test.rows) + "x" + std::to_string(d.test.cols) +
                                     " but the training images are " + std::to_string(d.train.rows) + "x" +
                                     std::to_string(d.train.cols));
  return d;
}

}  // namespace cadence::train
