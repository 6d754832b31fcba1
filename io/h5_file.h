// The parallel HDF5 file of one step: one global dataset per array, written
// and read as hyperslabs. The HDF5 engine (io/h5_engine.h) is its one user
// outside io/'s tests. HDF5 is not thread-safe: every function here runs
// its HDF5 calls under the process's HDF5 lock (io/h5_lock.h), and a file
// opened with MPI-IO (Create, OpenReadOnly) holds the lock on every rank
// from its opening until it is closed, on the thread that opened it (which
// must be the one that closes it). The ones marked collective must be
// called by every rank of the communicator in the same order with the same
// arguments.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/comm.h"
#include "base/status.h"
#include "base/types.h"
#include "io/h5_lock.h"
#include "io/storage.h"

namespace mhckpt::io {

/// Name of the attribute that holds the mhckpt dtype where the HDF5 type alone
/// does not say it (bfloat16 and float8 are stored as unsigned integers).
inline constexpr const char* kDTypeAttribute = "mhckpt_dtype";

/// A new HDF5 datatype handle for `dtype` (the caller closes it), used as both
/// file and memory type so bytes are copied without conversion.
int64_t H5TypeFor(DType dtype);

/// The HDF5 library loaded at run time (H5get_libversion).
struct H5Version {
  unsigned major = 0, minor = 0, release = 0;
};
H5Version H5LibraryVersion();

// Property lists and datatypes one file's datasets share (H5File::Shared in
// h5_file.cc): made once per file, not once per dataset.
struct H5Shared;

class Dataset {
 public:
  Dataset() = default;
  Dataset(Dataset&& o) noexcept;
  Dataset& operator=(Dataset&& o) noexcept;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;
  ~Dataset();

  /// Writes the row-major buffer `data` into `box`.
  Status Write(const Box& box, const void* data);
  /// Where the dataset's data ends in the file (contiguous layout, allocated
  /// at creation): offset + size; 0 for a dataset without data.
  [[nodiscard]] uint64_t EndInFile() const;
  /// Where the dataset's data starts in the file (contiguous layout,
  /// allocated at creation); nullopt for a dataset without data (no
  /// elements). The direct engine writes there (io/direct_engine.h).
  [[nodiscard]] std::optional<uint64_t> OffsetInFile() const;
  /// Takes part in a collective transfer with nothing to write.
  Status WriteNothing();
  /// Reads `box` into the row-major buffer `data`.
  Status Read(const Box& box, void* data);

 private:
  friend class H5File;
  Status Transfer(const Box* box, void* data, bool write);
  int64_t id_ = -1;
  int64_t type_ = -1;  // owned by shared_
  int64_t dxpl_ = -1;  // owned by shared_
  std::shared_ptr<H5Shared> shared_;
  std::string name_;
  std::vector<int64_t> shape_;
};

class H5File {
 public:
  H5File() = default;
  H5File(H5File&& o) noexcept;
  H5File& operator=(H5File&& o) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File();  ///< closes without flushing (an error path)

  /// Collective. Creates (truncates) `path` for parallel writing.
  static Result<H5File> Create(const std::string& path, const internal::Comm& comm,
                               io::Transfer transfer);
  /// Creates (truncates) `path` with HDF5's POSIX driver, for this process
  /// alone: the same file format and creation properties as Create, without
  /// MPI-IO and collective metadata (the direct engine's rank 0 lays out a
  /// step's file so; io/direct_engine.h). Not collective.
  /// `virtual_datasets`: in HDF5 1.10's file format, so that it can hold
  /// CreateVirtualDataset's.
  static Result<H5File> CreateLocal(const std::string& path, bool virtual_datasets = false);
  /// Collective. Opens `path` for parallel reading.
  static Result<H5File> OpenReadOnly(const std::string& path, const internal::Comm& comm,
                                     io::Transfer transfer);

  /// Collective. Creates dataset `/name` (intermediate groups included) with
  /// the global `shape`, allocated at once, never filled.
  Result<Dataset> CreateDataset(const std::string& name, DType dtype,
                                const std::vector<int64_t>& shape);
  /// One part of a virtual dataset: `box` of it is dataset `dataset` (of the
  /// box's shape) in the file `file`, named relative to this file's folder.
  struct VirtualSource {
    Box box;
    std::string file;
    std::string dataset;
  };
  /// A file created with CreateLocal(path, true): creates `/name` (intermediate groups
  /// included) as an HDF5 virtual dataset (VDS, HDF5 1.10 on) of the global
  /// `shape`, made of `sources`, which must not overlap. Readers of the file
  /// (h5py, h5dump) read the sources through it. A 0-d array is one source
  /// of one element.
  Status CreateVirtualDataset(const std::string& name, DType dtype,
                              const std::vector<int64_t>& shape,
                              std::span<const VirtualSource> sources);
  /// Collective. Opens `/name` and checks that its type and shape are the ones
  /// the marker promised (DataLoss otherwise).
  Result<Dataset> OpenDataset(const std::string& name, DType dtype,
                              const std::vector<int64_t>& shape);

  /// Collective. Makes the file durable (H5Fflush global, which syncs through
  /// MPI-IO; H5Fclose alone does not) and closes it.
  Status FlushAndClose();
  /// Collective. Closes the file: HDF5 writes its metadata, nothing is
  /// synced. For reading, and for the direct engine, which syncs itself.
  Status Close();

 private:
  // A Dataset with its type and transfer properties, not yet opened.
  [[nodiscard]] Dataset NewDataset(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape) const;

  int64_t id_ = -1;
  std::shared_ptr<H5Shared> shared_;
  io::Transfer transfer_ = io::Transfer::kIndependent;
  std::string path_;
  H5CollectiveHold hold_;  // files opened with MPI-IO, until closed
};

}  // namespace mhckpt::io
