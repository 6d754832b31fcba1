#include "base/guard.h"

#include <exception>
#include <string>

namespace mhckpt {

Status CurrentExceptionStatus(std::string_view where) {
  std::string what;
  try {
    throw;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception of unknown type";
  }
  std::string message(where);
  message += ": unexpected exception: ";
  message += what;
  return Internal(std::move(message));
}

}  // namespace mhckpt
