// The page of `tandem ui` (src/ui/assets/), compiled into the binary by cmake/embed_assets.cmake.
#pragma once

#include <cstddef>
#include <string_view>

namespace tandem::ui {

struct EmbeddedAsset {
  const char* path;  // "/index.html"
  const char* content_type;
  const char* data;
  size_t size;
};

extern const EmbeddedAsset kEmbeddedAssets[];
extern const size_t kEmbeddedAssetCount;

// The asset served at an URL path ("/" is /index.html); null when there is none.
const EmbeddedAsset* find_asset(std::string_view path);

}  // namespace tandem::ui
