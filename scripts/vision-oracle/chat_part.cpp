#include "llama.h"
#include "chat.h"
std::string oracle_format_user(const llama_model * model, const std::string & prompt) {
    auto tmpls = common_chat_templates_init(model, "");
    common_chat_msg msg; msg.role = "user"; msg.content = prompt;
    return common_chat_format_single(tmpls.get(), {}, msg, true, true);
}
