#include <cstdlib>
#include "llama.h"
#include "chat.h"
// The user turn as llama-mtmd-cli renders it: with the model's template through Jinja, or,
// with ORACLE_CHAT_TEMPLATE=NAME, as `--chat-template NAME` does (mtmd-cli's default
// --no-jinja: llama.cpp's built-in format of that name).
std::string oracle_format_user(const llama_model * model, const std::string & prompt) {
    const char * name = std::getenv("ORACLE_CHAT_TEMPLATE");
    auto tmpls = common_chat_templates_init(model, name ? name : "");
    common_chat_msg msg; msg.role = "user"; msg.content = prompt;
    return common_chat_format_single(tmpls.get(), {}, msg, true, name == nullptr);
}
