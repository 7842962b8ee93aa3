#include "server/web_page.h"

#include <string_view>

#include "server/web_assets.h"

namespace exl3::server {

namespace {

const char* content_type(std::string_view name) {
    if (name.ends_with(".html")) return "text/html; charset=utf-8";
    if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
    if (name.ends_with(".css")) return "text/css; charset=utf-8";
    return "application/octet-stream";
}

bool serve(std::string_view name, httplib::Response& res) {
    for (const auto& a : web::kAssets) {
        if (name != a.name) continue;
        res.set_content(reinterpret_cast<const char*>(a.data), a.size, content_type(name));
        // The page runs only its own scripts and talks only to this server.
        res.set_header("Content-Security-Policy",
                       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
        res.set_header("X-Content-Type-Options", "nosniff");
        res.set_header("Cache-Control", "no-cache");
        return true;
    }
    return false;
}

}  // namespace

bool is_page_path(const std::string& path) {
    return path == "/" || path.starts_with("/web/");
}

void add_page_routes(httplib::Server& http) {
    http.Get("/", [](const httplib::Request&, httplib::Response& res) { serve("index.html", res); });
    http.Get("/web/([A-Za-z0-9_.-]+)", [](const httplib::Request& req, httplib::Response& res) {
        if (!serve(req.matches[1].str(), res)) res.status = 404;
    });
}

}  // namespace exl3::server
