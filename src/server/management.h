// TabbyAPI-compatible model management, so that its clients (SillyTavern's loader, TabbyAPI GUIs) work unchanged:
// GET /v1/model (the loaded model), GET /v1/model/list and /v1/models (with --model-switch, every model under
// --models-dir), POST /v1/model/load (progress as server-sent events) and /v1/model/unload (the admin key),
// POST /v1/token/encode and /v1/token/decode, GET /v1/auth/permission. Keys as TabbyAPI takes them:
// "Authorization: Bearer KEY", "x-api-key: KEY" or "x-admin-key: KEY"; the admin key is good for every route.
#pragma once

#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "server/server.h"

namespace exl3::server {

struct Engine;
class ModelHost;

enum class Access { kNone, kUser, kAdmin };
// What a request's key allows (a server without keys allows everything).
Access access_of(const httplib::Request& req, const ServerOptions& o);
// Routes that change the model: they need the admin key.
bool needs_admin(const httplib::Request& req);

// Runs a handler on the Engine a POST body's `model` names (server.cpp: parses the body, finds the model).
using OnModel = std::function<void(const httplib::Request&, httplib::Response&,
                                   const std::function<void(Engine&, const nlohmann::ordered_json&)>&)>;
void add_management_routes(httplib::Server& http, ModelHost& host, const OnModel& on_model);

}  // namespace exl3::server
