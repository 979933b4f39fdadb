// libvirt domain XML through libxml2, for reading (domain_xml.cc) and editing
// (domain_setup.cc) alike: one parser with one size limit, element lookups
// that ignore namespaced elements (libvirt's own are in none), and one writer
// in libvirt's style.
#ifndef HVTRACE_HOSTD_XML_TREE_H_
#define HVTRACE_HOSTD_XML_TREE_H_

#include <libxml/tree.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd::xml {

struct DocFree {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using DocPtr = std::unique_ptr<xmlDoc, DocFree>;

// Domain XML comes from libvirt, a user's file or a peer over a remote URI:
// never more than this, never with network access or entity expansion.
constexpr size_t kMaxDomainXmlBytes = 16u << 20;

inline const xmlChar* X(const char* s) { return reinterpret_cast<const xmlChar*>(s); }

// A parsed document whose root element is <|root|>; the error says why not.
Result<DocPtr> Parse(std::string_view text, const char* root);

// An element called |name| in no namespace.
bool Named(const xmlNode* node, const char* name);
// The first child element called |name|, or null (|parent| may be null).
xmlNode* Child(xmlNode* parent, const char* name);
// Every child element called |name|, in document order.
std::vector<xmlNode*> Children(xmlNode* parent, const char* name);
// The attribute's value, or "" when absent.
std::string Prop(const xmlNode* node, const char* name);
// The text content, surrounding whitespace trimmed ("" for null).
std::string Text(const xmlNode* node);
void SetProp(xmlNode* node, const char* name, const std::string& value);
// A new element of |doc| (not yet linked) with attributes and text.
xmlNode* NewElement(xmlDoc* doc, const char* name,
                    std::initializer_list<std::pair<const char*, std::string>> props = {},
                    const std::string& text = "");
// Appends a new child element and returns it.
xmlNode* AddChild(xmlNode* parent, const char* name,
                  std::initializer_list<std::pair<const char*, std::string>> props = {},
                  const std::string& text = "");

// The document (or one element) as libvirt writes it: no XML declaration,
// two-space indentation, attributes in single quotes outside <metadata>.
std::string Dump(xmlDoc* doc);
std::string DumpElement(xmlDoc* doc, xmlNode* node, bool indent = false);

}  // namespace hvtrace::hostd::xml

#endif  // HVTRACE_HOSTD_XML_TREE_H_
