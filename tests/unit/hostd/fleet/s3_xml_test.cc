#include "s3_xml.h"

#include <gtest/gtest.h>

#include <string>

namespace hvtrace::hostd {
namespace {

TEST(S3Xml, ErrorBodyGivesCodeAndMessage) {
  S3ErrorBody e = ParseS3Error(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchBucket</Code>"
      "<Message>The specified bucket does not exist</Message><BucketName>b</BucketName>"
      "<RequestId>tx1</RequestId></Error>");
  EXPECT_EQ(e.code, "NoSuchBucket");
  EXPECT_EQ(e.message, "The specified bucket does not exist");
  // RGW's bodies have no Message at all.
  EXPECT_EQ(ParseS3Error("<Error><Code>InvalidAccessKeyId</Code></Error>").code,
            "InvalidAccessKeyId");
}

TEST(S3Xml, Malicious_NotAnErrorDocument) {
  EXPECT_TRUE(ParseS3Error("").code.empty());
  EXPECT_TRUE(ParseS3Error("<html><body>502 Bad Gateway</body></html>").code.empty());
  EXPECT_TRUE(ParseS3Error("<Error><Code>unterminated").code.empty());
  // Over the cap: not parsed at all.
  std::string big =
      "<Error><Code>X</Code><Message>" + std::string(kMaxXmlBody, 'a') + "</Message></Error>";
  EXPECT_TRUE(ParseS3Error(big).code.empty());
}

TEST(S3Xml, Malicious_EntitiesAreNotExpanded) {
  // A billion-laughs style document: no expansion, no file read.
  const std::string doc =
      "<?xml version=\"1.0\"?><!DOCTYPE Error [<!ENTITY x SYSTEM \"file:///etc/shadow\">"
      "<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;\">]>"
      "<Error><Code>&x;</Code><Message>&b;</Message></Error>";
  S3ErrorBody e = ParseS3Error(doc);
  EXPECT_EQ(e.code.find("root:"), std::string::npos);
  EXPECT_LE(e.message.size(), 512u);
}

TEST(S3Xml, ErrorFieldsAreCapped) {
  S3ErrorBody e = ParseS3Error("<Error><Code>" + std::string(1000, 'C') + "</Code><Message>" +
                               std::string(5000, 'm') + "</Message></Error>");
  EXPECT_EQ(e.code.size(), 128u);
  EXPECT_EQ(e.message.size(), 512u);
}

TEST(S3Xml, ListObjectsV2Page) {
  auto page = ParseListObjectsV2(
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
      "<Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>tok/+=</NextContinuationToken>"
      "<Contents><Key>p/a</Key><Size>3</Size><ETag>&quot;abc&quot;</ETag></Contents>"
      "<Contents><Key>p/b</Key><Size>12345678901</Size><ETag>\"d-2\"</ETag></Contents>"
      "</ListBucketResult>");
  ASSERT_TRUE(page.ok()) << page.error().message;
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "p/a");
  EXPECT_EQ(page->objects[0].etag, "abc");
  EXPECT_EQ(page->objects[1].size, 12345678901u);
  EXPECT_EQ(page->objects[1].etag, "d-2");
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "tok/+=");
}

TEST(S3Xml, Malicious_ListPages) {
  EXPECT_FALSE(ParseListObjectsV2("<Error><Code>AccessDenied</Code></Error>").ok());
  EXPECT_FALSE(ParseListObjectsV2("not xml").ok());
  // Truncated without a token would loop forever.
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated>"
                                  "</ListBucketResult>")
                   .ok());
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size>"
                                  "</Contents></ListBucketResult>")
                   .ok());
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><Contents><Size>1</Size></Contents>"
                                  "</ListBucketResult>")
                   .ok());
}

TEST(S3Xml, MultipartDocuments) {
  auto id = ParseInitiateMultipart(
      "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>"
      "<UploadId>2~abc</UploadId></InitiateMultipartUploadResult>");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "2~abc");
  EXPECT_FALSE(ParseInitiateMultipart("<InitiateMultipartUploadResult/>").ok());
  auto uploads = ParseListMultipartUploads(
      "<ListMultipartUploadsResult><Upload><Key>a</Key><UploadId>1</UploadId></Upload>"
      "<Upload><Key>b</Key><UploadId>2</UploadId></Upload></ListMultipartUploadsResult>");
  ASSERT_TRUE(uploads.ok());
  ASSERT_EQ(uploads->size(), 2u);
  EXPECT_EQ((*uploads)[1].key, "b");
  EXPECT_EQ((*uploads)[1].upload_id, "2");
}

}  // namespace
}  // namespace hvtrace::hostd
