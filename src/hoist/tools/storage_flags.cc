#include "hoist/tools/storage_flags.h"

namespace hoist {

void AddStorageFlags(CLI::App& app, StorageOptions& options) {
  const char* const group =
      "Object stores (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX)";
  app.add_option("--s3-endpoint", options.s3.endpoint,
                 "S3 endpoint URL (else AWS_ENDPOINT_URL_S3, "
                 "AWS_ENDPOINT_URL, AWS)")
      ->group(group);
  app.add_option("--s3-region", options.s3.region,
                 "S3 region (else AWS_REGION, AWS_DEFAULT_REGION, the "
                 "profile's)")
      ->group(group);
  app.add_option("--aws-profile", options.s3.profile,
                 "AWS profile whose keys and region to read from ~/.aws "
                 "(AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE); else "
                 "AWS_PROFILE, through the credential chain")
      ->group(group);
  app.add_option("--gcs-endpoint", options.gcs.endpoint,
                 "GCS endpoint of an emulator, e.g. http://127.0.0.1:4443 "
                 "(else STORAGE_EMULATOR_HOST; unset: Google's, with "
                 "application default credentials)")
      ->group(group);
}

}  // namespace hoist
