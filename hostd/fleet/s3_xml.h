// Sans-I/O parsers of the S3 XML bodies hvtrace reads: error documents,
// ListObjectsV2, ListMultipartUploads and InitiateMultipartUpload. The store
// is untrusted: callers cap the body before it gets here (kMaxXmlBody), and
// libxml2 parses with no network, no entities and no DTD.
#ifndef HVTRACE_HOSTD_FLEET_S3_XML_H_
#define HVTRACE_HOSTD_FLEET_S3_XML_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// The largest XML body read from the store (a listing page of 1000 keys is
// ~300 KiB).
inline constexpr size_t kMaxXmlBody = 4u << 20;

// <Error><Code>NoSuchBucket</Code><Message>…</Message></Error>; empty fields
// when the body is not such a document (a proxy's HTML page).
struct S3ErrorBody {
  std::string code;
  std::string message;
};
S3ErrorBody ParseS3Error(std::string_view body);

struct S3Object {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // Without the quotes.
};

struct S3ListPage {
  std::vector<S3Object> objects;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken when truncated.
};
Result<S3ListPage> ParseListObjectsV2(std::string_view body);

struct S3MultipartUpload {
  std::string key;
  std::string upload_id;
};
Result<std::vector<S3MultipartUpload>> ParseListMultipartUploads(std::string_view body);

// The UploadId of an InitiateMultipartUploadResult.
Result<std::string> ParseInitiateMultipart(std::string_view body);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_S3_XML_H_
