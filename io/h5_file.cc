#include "io/h5_file.h"

#include <hdf5.h>

#include <cerrno>
#include <cstring>

#include <array>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/h5_lock.h"
#include "io/posix_file.h"

static_assert(sizeof(hid_t) == sizeof(int64_t), "HDF5 1.10+ has 64-bit hid_t");

namespace mhckpt::io {
namespace {

// HDF5 prints its error stack to stderr by default; we turn it off once and
// read the stack into the Status message instead. Every function below that
// calls HDF5 is called under the HDF5 lock (io/h5_lock.h): the public ones
// take an H5LocalGuard (recursive) or run inside a file's collective hold.
void SilenceHdf5() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

herr_t CollectError(unsigned n, const H5E_error2_t* e, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (n < 3 && e->desc != nullptr) {
    if (!text->empty()) text->append("; ");
    text->append(fmt::format("{}: {}", e->func_name ? e->func_name : "?", e->desc));
  }
  return 0;
}

// The failing HDF5 call's error stack as a Status naming `what`.
Status H5Error(const std::string& what) {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, CollectError, &text);
  H5Eclear2(H5E_DEFAULT);
  return IoError(fmt::format("HDF5: {}{}{}", what, text.empty() ? "" : ": ", text));
}

// Closes an HDF5 handle of any kind when it leaves scope.
class Handle {
 public:
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (id_ >= 0) {
      H5I_type_t t = H5Iget_type(id_);
      if (t == H5I_DATASPACE)
        H5Sclose(id_);
      else if (t == H5I_GENPROP_LST)
        H5Pclose(id_);
      else if (t == H5I_DATATYPE)
        H5Tclose(id_);
      else if (t == H5I_ATTR)
        H5Aclose(id_);
      else if (t == H5I_DATASET)
        H5Dclose(id_);
    }
  }
  [[nodiscard]] hid_t get() const { return id_; }
  [[nodiscard]] bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
};

std::vector<hsize_t> Dims(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

hid_t CreateSpace(const std::vector<int64_t>& shape) {
  if (shape.empty()) return H5Screate(H5S_SCALAR);
  auto dims = Dims(shape);
  return H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
}

// Where the HDF5 type alone does not say `dtype` (bfloat16, float8: stored
// as unsigned integers), an attribute of dataset `id` does.
Status TagDType(hid_t id, const std::string& name, DType dtype) {
  if (!DTypeStoredAsRawBits(dtype)) return OkStatus();
  std::string value(DTypeName(dtype));
  Handle str(H5Tcopy(H5T_C_S1));
  H5Tset_size(str.get(), value.size());
  Handle scalar(H5Screate(H5S_SCALAR));
  Handle attr(H5Acreate2(id, kDTypeAttribute, str.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.ok() || H5Awrite(attr.get(), str.get(), value.data()) < 0) {
    return H5Error(fmt::format("write attribute of '{}'", name));
  }
  return OkStatus();
}

hid_t MakeDxpl(Transfer transfer) {
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(
      dxpl, transfer == Transfer::kCollective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  return dxpl;
}

// Large datasets start on 1 MiB boundaries (file-system stripes and pages).
void SetAlignment(hid_t fapl) { H5Pset_alignment(fapl, 4u << 20, 1u << 20); }

hid_t MakeFapl(MPI_Comm comm) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  // Metadata reads and writes are done collectively: one rank reads, all get it.
  H5Pset_all_coll_metadata_ops(fapl, true);
  H5Pset_coll_metadata_write(fapl, true);
  SetAlignment(fapl);
  return fapl;
}

// The file access properties of a new file. Many small arrays (10,000 of a
// few KiB) cost mostly per-object metadata, so (docs/PERFORMANCE.md, "Many
// small arrays"):
// - the 1.8 object format: groups keep their links in the object header, not
//   in a B-tree and local heap of their own, and headers are smaller;
//   readable by every HDF5 >= 1.8 (h5py included);
// - metadata and small raw data are allocated from 1 MiB blocks, so they lie
//   together and reach the file in fewer, larger writes.
void SetCreateProperties(hid_t fapl) {
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
  H5Pset_meta_block_size(fapl, 1u << 20);
  H5Pset_small_data_block_size(fapl, 1u << 20);
}

hid_t MakeCreateFapl(MPI_Comm comm) {
  hid_t fapl = MakeFapl(comm);
  SetCreateProperties(fapl);
  return fapl;
}

// The same file, made by one process through the POSIX driver.
// `virtual_datasets`: a file that may hold virtual datasets, which need the
// file format of HDF5 1.10 (readers of 1.8 cannot open it).
hid_t MakeLocalCreateFapl(bool virtual_datasets) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_sec2(fapl);
  SetAlignment(fapl);
  SetCreateProperties(fapl);
  if (virtual_datasets) H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V110);
  return fapl;
}

// The little-endian integer type of `size` bytes, or -1.
hid_t IntegerLE(size_t size, bool is_signed) {
  switch (size) {
    case 1: return is_signed ? H5T_STD_I8LE : H5T_STD_U8LE;
    case 2: return is_signed ? H5T_STD_I16LE : H5T_STD_U16LE;
    case 4: return is_signed ? H5T_STD_I32LE : H5T_STD_U32LE;
    case 8: return is_signed ? H5T_STD_I64LE : H5T_STD_U64LE;
    default: return -1;
  }
}

// The little-endian IEEE 754 type of `size` bytes, or -1.
hid_t IeeeFloatLE(size_t size) {
  if (size == 4) return H5Tcopy(H5T_IEEE_F32LE);
  if (size == 8) return H5Tcopy(H5T_IEEE_F64LE);
  if (size != 2) return -1;
  // binary16: sign bit 15, 5 exponent bits at 10, 10 mantissa bits, bias 15.
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

}  // namespace

// The one place that turns the engine-neutral description of a dtype
// (base/dtype.h) into an HDF5 type.
int64_t H5TypeFor(DType dtype) {
  if (!IsValidDType(dtype)) return -1;
  H5LocalGuard guard;
  const DTypeInfo& info = GetDTypeInfo(dtype);
  hid_t base = -1;
  switch (info.kind) {
    case DTypeKind::kBool: {
      // h5py's convention: an int8 enum {FALSE = 0, TRUE = 1} reads as numpy bool.
      hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
      int8_t f = 0, v = 1;
      H5Tenum_insert(t, "FALSE", &f);
      H5Tenum_insert(t, "TRUE", &v);
      return t;
    }
    case DTypeKind::kIeeeFloat: return IeeeFloatLE(info.size);
    case DTypeKind::kSignedInt: base = IntegerLE(info.size, true); break;
    case DTypeKind::kUnsignedInt:
    case DTypeKind::kRawBits: base = IntegerLE(info.size, false); break;  // see kDTypeAttribute
  }
  return base < 0 ? -1 : H5Tcopy(base);
}

// Shared by a file and its datasets; closed when the last of them goes.
struct H5Shared {
  explicit H5Shared(Transfer transfer) : dxpl(MakeDxpl(transfer)) {
    // Members are made before this body runs: their callers hold the lock.
    types.fill(-1);
    H5Pset_create_intermediate_group(lcpl, 1);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  }
  H5Shared(const H5Shared&) = delete;
  H5Shared& operator=(const H5Shared&) = delete;
  ~H5Shared() {
    H5LocalGuard guard;
    for (hid_t t : types) {
      if (t >= 0) H5Tclose(t);
    }
    H5Pclose(dxpl);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
  }
  // The HDF5 type of `dtype`, made on first use.
  hid_t Type(DType dtype) {
    hid_t& t = types.at(static_cast<size_t>(dtype));
    if (t < 0) t = H5TypeFor(dtype);
    return t;
  }

  hid_t dxpl;
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::array<hid_t, kNumDTypes> types{};
};

// ---- Dataset ----

Dataset::Dataset(Dataset&& o) noexcept { *this = std::move(o); }

Dataset& Dataset::operator=(Dataset&& o) noexcept {
  std::swap(id_, o.id_);
  std::swap(type_, o.type_);
  std::swap(dxpl_, o.dxpl_);
  std::swap(shared_, o.shared_);
  std::swap(name_, o.name_);
  std::swap(shape_, o.shape_);
  return *this;
}

Dataset::~Dataset() {
  if (id_ < 0) return;
  H5LocalGuard guard;
  H5Dclose(id_);
}

Status Dataset::Write(const Box& box, const void* data) {
  MHCKPT_RETURN_IF_ERROR(fault::Hit("h5_write"));
  H5LocalGuard guard;
  return Transfer(&box, const_cast<void*>(data), true);  // NOLINT: H5Dwrite reads only
}
uint64_t Dataset::EndInFile() const {
  std::optional<uint64_t> offset = OffsetInFile();
  if (!offset) return 0;
  H5LocalGuard guard;
  return *offset + H5Dget_storage_size(id_);
}

std::optional<uint64_t> Dataset::OffsetInFile() const {
  H5LocalGuard guard;
  haddr_t offset = H5Dget_offset(id_);
  if (offset == HADDR_UNDEF) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  return static_cast<uint64_t>(offset);
}

Status Dataset::WriteNothing() {
  H5LocalGuard guard;
  return Transfer(nullptr, nullptr, true);
}
Status Dataset::Read(const Box& box, void* data) {
  MHCKPT_RETURN_IF_ERROR(fault::Hit("h5_read"));
  H5LocalGuard guard;
  return Transfer(&box, data, false);
}

Status Dataset::Transfer(const Box* box, void* data, bool write) {
  Handle file_space(H5Dget_space(id_));
  if (!file_space.ok()) return H5Error(fmt::format("get space of '{}'", name_));
  hid_t mem_space_id;
  bool empty = box == nullptr || Volume(box->count).value_or(0) == 0;
  if (empty) {
    H5Sselect_none(file_space.get());
    mem_space_id = H5Scopy(file_space.get());
  } else if (shape_.empty()) {
    mem_space_id = H5Screate(H5S_SCALAR);
  } else {
    auto start = Dims(box->start), count = Dims(box->count);
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                            nullptr) < 0) {
      return H5Error(fmt::format("select box {} of '{}'", BoxToString(*box), name_));
    }
    mem_space_id = H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr);
  }
  Handle mem_space(mem_space_id);
  if (empty) H5Sselect_none(mem_space.get());
  herr_t rc = write ? H5Dwrite(id_, type_, mem_space.get(), file_space.get(), dxpl_, data)
                    : H5Dread(id_, type_, mem_space.get(), file_space.get(), dxpl_, data);
  if (rc < 0) {
    return H5Error(fmt::format("{} box {} of '{}'", write ? "write" : "read",
                               box ? BoxToString(*box) : "(none)", name_));
  }
  return OkStatus();
}

// ---- H5File ----

H5File::H5File(H5File&& o) noexcept { *this = std::move(o); }

H5File& H5File::operator=(H5File&& o) noexcept {
  std::swap(id_, o.id_);
  std::swap(transfer_, o.transfer_);
  std::swap(shared_, o.shared_);
  std::swap(path_, o.path_);
  std::swap(hold_, o.hold_);
  return *this;
}

H5File::~H5File() {
  if (id_ >= 0) {
    H5LocalGuard guard;
    H5Fclose(id_);
  }
  shared_.reset();  // closes the shared handles while hold_ still holds the lock
}

Result<H5File> H5File::Create(const std::string& path, const internal::Comm& comm,
                              io::Transfer transfer) {
  H5CollectiveHold hold = H5CollectiveHold::Acquire(comm);  // H5Fcreate is collective
  H5LocalGuard guard;
  SilenceHdf5();
  Handle fapl(MakeCreateFapl(comm.get()));  // MPI-IO takes the MPI handle
  H5File f;
  f.id_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (f.id_ < 0) return H5Error(fmt::format("create '{}'", path));
  f.transfer_ = transfer;
  f.shared_ = std::make_shared<H5Shared>(transfer);
  f.path_ = path;
  f.hold_ = std::move(hold);  // until the file is closed
  return f;
}

Result<H5File> H5File::CreateLocal(const std::string& path, bool virtual_datasets) {
  H5LocalGuard guard;
  SilenceHdf5();
  Handle fapl(MakeLocalCreateFapl(virtual_datasets));
  H5File f;
  f.id_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (f.id_ < 0) return H5Error(fmt::format("create '{}'", path));
  f.transfer_ = io::Transfer::kIndependent;
  f.shared_ = std::make_shared<H5Shared>(f.transfer_);
  f.path_ = path;
  return f;
}

Result<H5File> H5File::OpenReadOnly(const std::string& path, const internal::Comm& comm,
                                    io::Transfer transfer) {
  H5CollectiveHold hold = H5CollectiveHold::Acquire(comm);  // H5Fopen is collective
  H5LocalGuard guard;
  SilenceHdf5();
  Handle fapl(MakeFapl(comm.get()));  // MPI-IO takes the MPI handle
  H5File f;
  f.id_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (f.id_ < 0) return H5Error(fmt::format("open '{}'", path));
  f.transfer_ = transfer;
  f.shared_ = std::make_shared<H5Shared>(transfer);
  f.path_ = path;
  f.hold_ = std::move(hold);  // until the file is closed
  return f;
}

Dataset H5File::NewDataset(const std::string& name, DType dtype,
                           const std::vector<int64_t>& shape) const {
  H5LocalGuard guard;
  Dataset d;
  d.name_ = name;
  d.shape_ = shape;
  d.shared_ = shared_;
  d.type_ = shared_->Type(dtype);
  d.dxpl_ = shared_->dxpl;
  return d;
}

Result<Dataset> H5File::CreateDataset(const std::string& name, DType dtype,
                                      const std::vector<int64_t>& shape) {
  H5LocalGuard guard;
  Dataset d = NewDataset(name, dtype, shape);
  Handle space(CreateSpace(shape));
  d.id_ = H5Dcreate2(id_, ("/" + name).c_str(), d.type_, space.get(), shared_->lcpl, shared_->dcpl,
                     H5P_DEFAULT);
  if (d.id_ < 0) return H5Error(fmt::format("create dataset '{}'", name));
  MHCKPT_RETURN_IF_ERROR(TagDType(d.id_, name, dtype));
  return d;
}

Status H5File::CreateVirtualDataset(const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape,
                                    std::span<const VirtualSource> sources) {
  H5LocalGuard guard;
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  Handle space(CreateSpace(shape));
  for (const VirtualSource& src : sources) {
    Handle source_space(CreateSpace(src.box.count));
    if (!shape.empty()) {
      const std::vector<hsize_t> start = Dims(src.box.start), count = Dims(src.box.count);
      if (H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                              nullptr) < 0) {
        return H5Error(fmt::format("select box {} of '{}'", BoxToString(src.box), name));
      }
    }
    if (H5Pset_virtual(dcpl.get(), space.get(), src.file.c_str(), src.dataset.c_str(),
                       source_space.get()) < 0) {
      return H5Error(fmt::format("map box {} of '{}' onto '{}' in '{}'", BoxToString(src.box), name,
                                 src.dataset, src.file));
    }
  }
  H5Sselect_all(space.get());
  const hid_t type = shared_->Type(dtype);
  Handle ds(H5Dcreate2(id_, ("/" + name).c_str(), type, space.get(), shared_->lcpl, dcpl.get(),
                       H5P_DEFAULT));
  if (!ds.ok()) return H5Error(fmt::format("create virtual dataset '{}'", name));
  return TagDType(ds.get(), name, dtype);
}

Result<Dataset> H5File::OpenDataset(const std::string& name, DType dtype,
                                    const std::vector<int64_t>& shape) {
  H5LocalGuard guard;
  Dataset d = NewDataset(name, dtype, shape);
  d.id_ = H5Dopen2(id_, ("/" + name).c_str(), H5P_DEFAULT);
  if (d.id_ < 0) {
    H5Eclear2(H5E_DEFAULT);
    return DataLoss(fmt::format("array '{}': dataset missing from '{}'", name, path_));
  }
  Handle file_type(H5Dget_type(d.id_));
  if (H5Tequal(file_type.get(), d.type_) <= 0) {
    return DataLoss(fmt::format("array '{}': stored HDF5 type does not match dtype {}", name,
                                DTypeName(dtype)));
  }
  Handle space(H5Dget_space(d.id_));
  int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(rank > 0 ? static_cast<size_t>(rank) : 0);
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  if (rank < 0 || dims != Dims(shape)) {
    return DataLoss(fmt::format("array '{}': stored shape does not match the marker's {}", name,
                                ShapeToString(shape)));
  }
  return d;
}

Status H5File::FlushAndClose() {
  H5LocalGuard guard;
  Status s;
  if (H5Fflush(id_, H5F_SCOPE_GLOBAL) < 0) s = H5Error(fmt::format("flush '{}'", path_));
  // The data file's fsync (H5Fflush ends in MPI_File_sync) behind the fault
  // seam. The flush is collective, so it still runs on every rank; an
  // injected error stands in for its outcome.
  if (int e = fault::Errno("data_fsync"); e != 0 && s.ok()) {
    s = IoError(fmt::format("flush '{}': {} (injected at data_fsync)", path_, std::strerror(e)));
  }
  if (H5Fclose(id_) < 0 && s.ok()) s = H5Error(fmt::format("close '{}'", path_));
  id_ = -1;
  shared_.reset();
  hold_.Release();
  // Why again: closing rewrites the superblock (the end of the file) after
  // the flush's sync (found by tests/crashstate).
  if (s.ok()) s = FsyncFile(path_);
  return s;
}

Status H5File::Close() {
  H5LocalGuard guard;
  Status s;
  if (H5Fclose(id_) < 0) s = H5Error(fmt::format("close '{}'", path_));
  id_ = -1;
  shared_.reset();
  hold_.Release();
  return s;
}

H5Version H5LibraryVersion() {
  H5LocalGuard guard;
  H5Version v;
  if (H5get_libversion(&v.major, &v.minor, &v.release) < 0) return {};
  return v;
}

}  // namespace mhckpt::io
