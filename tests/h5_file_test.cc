// io/h5_file.h: every row of the dtype table maps to the HDF5 type that
// docs/FORMAT.md lists, of the dtype's size, little-endian.
#include <hdf5.h>

#include <gtest/gtest.h>

#include <string>

#include "base/dtype.h"
#include "io/h5_file.h"

namespace mhckpt {
namespace {

// An HDF5 type handle closed at the end of the scope.
struct Type {
  explicit Type(DType dtype) : id(io::H5TypeFor(dtype)) {}
  ~Type() {
    if (id >= 0) H5Tclose(id);
  }
  Type(const Type&) = delete;
  Type& operator=(const Type&) = delete;
  hid_t id;
};

TEST(H5Types, EveryDTypeMapsToAnHdf5TypeOfItsSizeAndKind) {
  for (const DTypeInfo& info : kDTypeTable) {
    SCOPED_TRACE(std::string(info.name));
    Type t(info.dtype);
    ASSERT_GE(t.id, 0);
    EXPECT_EQ(H5Tget_size(t.id), info.size);
    switch (info.kind) {
      case DTypeKind::kBool: EXPECT_EQ(H5Tget_class(t.id), H5T_ENUM); break;
      case DTypeKind::kSignedInt:
        EXPECT_EQ(H5Tget_class(t.id), H5T_INTEGER);
        EXPECT_EQ(H5Tget_sign(t.id), H5T_SGN_2);
        break;
      case DTypeKind::kUnsignedInt:
      case DTypeKind::kRawBits:
        EXPECT_EQ(H5Tget_class(t.id), H5T_INTEGER);
        EXPECT_EQ(H5Tget_sign(t.id), H5T_SGN_NONE);
        break;
      case DTypeKind::kIeeeFloat: EXPECT_EQ(H5Tget_class(t.id), H5T_FLOAT); break;
    }
    if (info.kind != DTypeKind::kBool) EXPECT_EQ(H5Tget_order(t.id), H5T_ORDER_LE);
  }
  EXPECT_LT(io::H5TypeFor(static_cast<DType>(kNumDTypes)), 0);
}

// The exact types of docs/FORMAT.md's table: the file format must not change.
TEST(H5Types, MatchTheFormatDocument) {
  auto equal = [](DType d, hid_t expected) {
    Type t(d);
    return H5Tequal(t.id, expected) > 0;
  };
  EXPECT_TRUE(equal(DType::kInt8, H5T_STD_I8LE));
  EXPECT_TRUE(equal(DType::kInt64, H5T_STD_I64LE));
  EXPECT_TRUE(equal(DType::kUInt32, H5T_STD_U32LE));
  EXPECT_TRUE(equal(DType::kFloat32, H5T_IEEE_F32LE));
  EXPECT_TRUE(equal(DType::kFloat64, H5T_IEEE_F64LE));
  EXPECT_TRUE(equal(DType::kBFloat16, H5T_STD_U16LE));
  EXPECT_TRUE(equal(DType::kFloat8E4M3, H5T_STD_U8LE));
  EXPECT_TRUE(equal(DType::kFloat8E5M2, H5T_STD_U8LE));
  Type half(DType::kFloat16);
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  H5Tget_fields(half.id, &spos, &epos, &esize, &mpos, &msize);
  EXPECT_EQ(spos, 15u);
  EXPECT_EQ(epos, 10u);
  EXPECT_EQ(esize, 5u);
  EXPECT_EQ(mpos, 0u);
  EXPECT_EQ(msize, 10u);
  EXPECT_EQ(H5Tget_ebias(half.id), 15u);
  Type boolean(DType::kBool);
  int member_count = H5Tget_nmembers(boolean.id);
  EXPECT_EQ(member_count, 2);
}

}  // namespace
}  // namespace mhckpt
