#include "idx.hpp"

#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using bytes = std::vector<std::uint8_t>;
using cadence::train::dataset;
using cadence::train::idx_array;

bytes idx(const std::vector<std::uint32_t>& dims, const bytes& data, std::uint8_t type = 0x08) {
  bytes b = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (const std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

/// A fresh directory per test case (and per process: ctest runs both standards at once).
class temp_dir {
public:
  temp_dir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("cadence-idx-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter));
    fs::create_directories(path_);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const bytes& b, bool gz) const {
    const std::string p = (path_ / name).string();
    if (gz) {
      gzFile f = gzopen(p.c_str(), "wb");
      REQUIRE(f != nullptr);
      if (!b.empty()) REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
      gzclose(f);
    } else {
      std::ofstream(p, std::ios::binary)
          .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    }
    return p;
  }
  std::string dir() const { return path_.string(); }

private:
  fs::path path_;
};

std::string error_of(const std::string& path) {
  try {
    (void)cadence::train::read_idx(path);
  } catch (const cadence::parse_error& e) {
    return e.what();
  }
  return "(no error)";
}

const bytes two_images = {0, 255, 51, 102, 1, 2, 3, 4};  // 2 images of 2x2

}  // namespace

TEST_CASE("read_idx reads the same array from a gzip-compressed and a plain file") {
  temp_dir d;
  for (const bool gz : {false, true}) {
    CAPTURE(gz);
    const idx_array a = cadence::train::read_idx(d.write(gz ? "a.gz" : "a", idx({2, 2, 2}, two_images), gz));
    CHECK(a.dims == std::vector<std::size_t>{2, 2, 2});
    CHECK(a.data == two_images);
  }
}

TEST_CASE("read_idx rejects every malformed file with a message naming the file and the problem") {
  temp_dir d;
  for (const bool gz : {false, true}) {
    CAPTURE(gz);
    auto check = [&](const std::string& name, const bytes& b, const std::string& want) {
      const std::string p = d.write(name + (gz ? ".gz" : ""), b, gz);
      const std::string msg = error_of(p);
      CAPTURE(msg);
      CHECK(msg.find("'" + p + "'") != std::string::npos);
      CHECK(msg.find(want) != std::string::npos);
    };
    check("empty", {}, "truncated: the 4-byte magic number is missing");
    check("magic", {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7}, "bad magic number 0x1f000801");
    check("ndims0", {0, 0, 0x08, 0x00}, "bad magic number 0x00000800");
    check("ndims9", {0, 0, 0x08, 0x09}, "bad magic number");
    check("type", idx({2}, {1, 2}, 0x0D), "unsupported data type 0x0d");
    check("header", {0, 0, 0x08, 0x03, 0, 0, 0, 2, 0, 0}, "truncated: the header ends inside dimension 1");
    check("zero_dim", idx({2, 0, 2}, {}), "dimension 1 is 0");
    check("huge", idx({0xFFFFFFFFu, 0xFFFFFFFFu}, {}), "more than 2 GiB");
    check("short", idx({2, 2, 2}, {1, 2, 3}), "truncated: the header promises 8 bytes of data, the file has 3");
    check("long", idx({2}, {1, 2, 3}), "trailing bytes after the 2 bytes of data");
  }
  const std::string missing = d.dir() + "/nope";
  CHECK(error_of(missing) == "cadence::train: '" + missing + "': cannot open the file");
}

TEST_CASE("a gzip file cut short is reported, not read as a short array") {
  temp_dir d;
  const std::string p = d.write("cut.gz", idx({1000}, bytes(1000, 7)), true);
  // Keep the gzip header and part of the stream only.
  bytes raw;
  {
    std::ifstream in(p, std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
  }
  raw.resize(raw.size() / 2);
  const std::string cut = d.write("cut2.gz", raw, false);
  const std::string msg = error_of(cut);
  CAPTURE(msg);
  CHECK(msg.find("'" + cut + "'") != std::string::npos);
  CHECK(msg != "(no error)");
}

TEST_CASE("read_idx_dataset scales pixels to [0, 1] and checks the labels against the images") {
  temp_dir d;
  const std::string images = d.write("im", idx({2, 2, 2}, two_images), false);
  SUBCASE("a good pair") {
    const dataset ds = cadence::train::read_idx_dataset(images, d.write("lb.gz", idx({2}, {3, 9}), true));
    CHECK(ds.size() == 2);
    CHECK(ds.rows == 2);
    CHECK(ds.cols == 2);
    CHECK(ds.features() == 4);
    CHECK(ds.image(0)[1] == 1.0f);
    CHECK(ds.image(0)[2] == doctest::Approx(0.2));
    CHECK(ds.labels == bytes{3, 9});
  }
  auto message = [&](const std::string& im, const std::string& lb) -> std::string {
    try {
      (void)cadence::train::read_idx_dataset(im, lb);
    } catch (const cadence::parse_error& e) {
      return e.what();
    }
    return "(no error)";
  };
  SUBCASE("label count differs from image count") {
    const std::string lb = d.write("lb3", idx({3}, {1, 2, 3}), false);
    CHECK(message(images, lb) == "cadence::train: '" + lb + "': has 3 labels but '" + images + "' has 2 images");
  }
  SUBCASE("a label out of range") {
    const std::string lb = d.write("lb10", idx({2}, {1, 10}), false);
    CHECK(message(images, lb) == "cadence::train: '" + lb + "': label 1 is 10, out of range for 10 classes");
  }
  SUBCASE("images that are not 3-dimensional") {
    const std::string flat = d.write("flat", idx({8}, two_images), false);
    CHECK(message(flat, d.write("lb", idx({2}, {1, 2}), false)) ==
          "cadence::train: '" + flat + "': expected 3 dimensions (images, rows, cols), got 1");
  }
  SUBCASE("labels that are not 1-dimensional") {
    const std::string lb = d.write("lb2d", idx({2, 1}, {1, 2}), false);
    CHECK(message(images, lb) == "cadence::train: '" + lb + "': expected 1 dimension (labels), got 2");
  }
}

TEST_CASE("load_fashion_mnist names the missing file and the Debian package that provides it") {
  temp_dir d;
  try {
    (void)cadence::train::load_fashion_mnist(d.dir());
    FAIL("no error");
  } catch (const cadence::parse_error&) {
    FAIL("a missing file is not a parse error");
  } catch (const cadence::error& e) {
    const std::string msg = e.what();
    CHECK(msg.find(d.dir() + "/train-images-idx3-ubyte.gz") != std::string::npos);
    CHECK(msg.find("install the Debian package dataset-fashion-mnist") != std::string::npos);
  }
}

TEST_CASE("load_fashion_mnist reads a directory of plain and compressed files") {
  temp_dir d;
  d.write("train-images-idx3-ubyte.gz", idx({2, 2, 2}, two_images), true);
  d.write("train-labels-idx1-ubyte", idx({2}, {0, 1}), false);
  d.write("t10k-images-idx3-ubyte", idx({1, 2, 2}, {9, 9, 9, 9}), false);
  d.write("t10k-labels-idx1-ubyte.gz", idx({1}, {5}), true);
  const auto data = cadence::train::load_fashion_mnist(d.dir());
  CHECK(data.train.size() == 2);
  CHECK(data.test.size() == 1);
  CHECK(data.test.labels[0] == 5);
}
