#include "py_storage.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "py_status.h"

namespace hoist {

ObjectStoreOptions ObjectStoreOptionsOf(
    const std::map<std::string, std::string>& given) {
  ObjectStoreOptions options;
  for (const auto& [name, value] : given) {
    const auto number = [&, &name = name, &value = value]() {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || v < 0) {
        Invalid(absl::StrFormat(
            "storage_options['%s'] = '%s': not a number >= 0", name, value));
      }
      return v;
    };
    if (name == "endpoint") {
      options.endpoint = value;
    } else if (name == "region") {
      options.region = value;
    } else if (name == "access_key_id") {
      options.access_key_id = value;
    } else if (name == "secret_access_key") {
      options.secret_access_key = value;
    } else if (name == "session_token") {
      options.session_token = value;
    } else if (name == "request_timeout_s") {
      options.request_timeout_s = number();
    } else if (name == "connect_timeout_s") {
      options.connect_timeout_s = number();
    } else if (name == "max_attempts") {
      options.max_attempts = static_cast<int>(number());
    } else if (name == "retry_budget") {
      options.retry_budget = static_cast<int>(number());
    } else if (name == "profile") {
      options.profile = value;
    } else {
      Invalid(
          absl::StrFormat("storage_options: no option '%s' (endpoint, region, "
                          "access_key_id, secret_access_key, session_token, "
                          "request_timeout_s, connect_timeout_s, max_attempts, "
                          "retry_budget, profile)",
                          name));
    }
  }
  return options;
}

StorageOptions StorageOptionsOf(
    const std::map<std::string, std::string>& given) {
  const ObjectStoreOptions options = ObjectStoreOptionsOf(given);
  return {.s3 = options, .gcs = options};
}

}  // namespace hoist
