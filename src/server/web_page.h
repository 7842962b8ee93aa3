// The chat page at / (src/server/web/, compiled into the program): static files, served without the API key (the
// page asks for it and sends it with its requests).
#pragma once

#include <httplib.h>

#include <string>

namespace exl3::server {

bool is_page_path(const std::string& path);  // "/" and "/web/..."
void add_page_routes(httplib::Server& http);

}  // namespace exl3::server
