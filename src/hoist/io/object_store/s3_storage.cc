// The S3 backend: Arrow's S3FileSystem, configured as the AWS tools are
// (see ObjectStoreOptions and docs/object-storage.md), behind
// ObjectStorage.
//
// Arrow's S3 support is process-wide state (the AWS SDK), shared with
// pyarrow when both live in one Python process: they load the same
// libarrow_s3, so EnsureS3Initialized() initializes it once for both, and
// the finalizer registered here runs at exit after pyarrow's own (Python's
// atexit handlers run first); finalizing twice is harmless.
#include <arrow/filesystem/s3fs.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "hoist/base/status_macros.h"
#include "hoist/io/object_store/object_storage.h"
#include "hoist/io/object_store/retry_policy.h"

namespace hoist {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

// The `key = value` lines of section `section` of the INI file `path`
// (the AWS shared files' format); empty when the file or section is
// missing.
std::map<std::string, std::string> IniSection(const std::string& path,
                                              const std::string& section) {
  std::map<std::string, std::string> values;
  std::ifstream in(path);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text.front() == '[' && text.back() == ']') {
      inside = absl::StripAsciiWhitespace(text.substr(1, text.size() - 2)) ==
               section;
      continue;
    }
    const size_t equals = text.find('=');
    if (!inside || equals == absl::string_view::npos) continue;
    values[std::string(absl::StripAsciiWhitespace(text.substr(0, equals)))] =
        std::string(absl::StripAsciiWhitespace(text.substr(equals + 1)));
  }
  return values;
}

std::string AwsFile(const char* variable, const char* name) {
  std::string path = Env(variable);
  if (path.empty()) path = Env("HOME") + "/.aws/" + name;
  return path;
}

// `options` with the keys and region of its profile filled in where it
// gives none; kInvalidArgument for a profile without keys.
absl::StatusOr<ObjectStoreOptions> WithProfile(ObjectStoreOptions options) {
  if (options.profile.empty()) return options;
  const std::string credentials_file =
      AwsFile("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::string config_file = AwsFile("AWS_CONFIG_FILE", "config");
  std::map<std::string, std::string> keys =
      IniSection(credentials_file, options.profile);
  // The config file names a profile "profile NAME" ("default" as it is).
  std::map<std::string, std::string> config = IniSection(
      config_file, options.profile == "default" ? options.profile
                                                : "profile " + options.profile);
  keys.merge(config);  // the credentials file's first
  if (keys["aws_access_key_id"].empty() ||
      keys["aws_secret_access_key"].empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "S3 profile '%s': no aws_access_key_id and aws_secret_access_key in "
        "%s or %s (a profile that assumes a role or signs in through SSO: "
        "name it in AWS_PROFILE instead)",
        options.profile, credentials_file, config_file));
  }
  if (options.access_key_id.empty() && options.secret_access_key.empty()) {
    options.access_key_id = keys["aws_access_key_id"];
    options.secret_access_key = keys["aws_secret_access_key"];
    options.session_token = keys["aws_session_token"];
  }
  if (options.region.empty()) options.region = keys["region"];
  return options;
}

absl::Status InitializeS3Once() {
  static std::once_flag once;
  static arrow::Status status;
  std::call_once(once, [] { status = arrow::fs::EnsureS3Initialized(); });
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrFormat("initializing S3 (Arrow): %s", status.message()));
  }
  return absl::OkStatus();
}

// Finalizes S3 at exit unless someone (pyarrow) did. Registered once the
// first S3 filesystem exists: exit handlers run in the reverse order of
// their registration, so this one runs before the destructors of the
// statics Arrow made for that filesystem, which finalizing still uses.
void FinalizeS3AtExit() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] {
      if (!arrow::fs::IsS3Finalized()) {
        const arrow::Status finalized = arrow::fs::FinalizeS3();
        (void)finalized;  // at exit: nobody left to tell
      }
    });
  });
}

// Arrow's S3 client asks this whether and when to retry a failed request
// (RetryPolicy). The AWS SDK's own verdict (AWSError::ShouldRetry: 5xx,
// throttling such as SlowDown, a reset connection, a timeout) says which
// errors may be retried.
class S3Retries final : public arrow::fs::S3RetryStrategy {
 public:
  explicit S3Retries(RetryOptions options) : policy_(options) {}
  bool ShouldRetry(const AWSErrorDetail& error,
                   int64_t attempted_retries) override {
    return policy_.ShouldRetry(error.should_retry, attempted_retries);
  }
  int64_t CalculateDelayBeforeNextRetry(const AWSErrorDetail&,
                                        int64_t attempted_retries) override {
    return absl::ToInt64Milliseconds(policy_.Delay(attempted_retries));
  }

 private:
  RetryPolicy policy_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> MakeS3Storage(
    const ObjectStoreOptions& given) {
  if (absl::Status s = InitializeS3Once(); !s.ok()) return s;
  ASSIGN_OR_RETURN(const ObjectStoreOptions options, WithProfile(given));
  arrow::fs::S3Options s3 = arrow::fs::S3Options::Defaults();
  if (!options.access_key_id.empty() || !options.secret_access_key.empty()) {
    if (options.access_key_id.empty() || options.secret_access_key.empty()) {
      return absl::InvalidArgumentError(
          "S3: an access key id needs its secret access key, and the other "
          "way round");
    }
    s3.ConfigureAccessKey(options.access_key_id, options.secret_access_key,
                          options.session_token);
  }
  std::string endpoint = options.endpoint;
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (ConsumeScheme(endpoint, "http://")) {
    s3.scheme = "http";
  } else if (ConsumeScheme(endpoint, "https://")) {
    s3.scheme = "https";
  } else if (!endpoint.empty() && absl::StrContains(endpoint, "://")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "S3 endpoint '%s': the scheme must be http or https", endpoint));
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  s3.endpoint_override = endpoint;
  std::string region = options.region;
  if (region.empty()) region = Env("AWS_REGION");
  if (region.empty()) region = Env("AWS_DEFAULT_REGION");
  if (!region.empty()) s3.region = region;
  if (s3.region.empty()) s3.region = "us-east-1";
  // A path-style URL for a server of one's own (MinIO, SeaweedFS).
  if (!endpoint.empty()) s3.force_virtual_addressing = false;
  s3.connect_timeout =
      options.connect_timeout_s > 0 ? options.connect_timeout_s : 10;
  s3.request_timeout =
      options.request_timeout_s > 0 ? options.request_timeout_s : 60;
  RetryOptions retries;
  if (options.max_attempts > 0) retries.max_attempts = options.max_attempts;
  if (options.retry_budget > 0) retries.budget = options.retry_budget;
  s3.retry_strategy = std::make_shared<S3Retries>(retries);
  // Each whole part goes straight from the caller's buffer, one request at
  // a time per object: memory stays one part per object being written.
  s3.background_writes = false;
  arrow::Result<std::shared_ptr<arrow::fs::S3FileSystem>> fs =
      arrow::fs::S3FileSystem::Make(s3);
  if (!fs.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("S3: %s", fs.status().message()));
  }
  FinalizeS3AtExit();
  // Four objects at once per process: each holds up to one 10 MiB part
  // (Arrow's, not configurable) of what is left of an extent between
  // parts, so a save's memory stays within the pool plus 64 MiB.
  return MakeObjectStorage(*std::move(fs), "s3://", /*writer_streams=*/4);
}

}  // namespace hoist
