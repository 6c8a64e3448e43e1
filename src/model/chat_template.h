// Chat templates: the prompt text for a conversation, in the format the model was
// trained on. The family is detected from the GGUF key tokenizer.chat_template
// (ChatML as Qwen uses it, llama-2 [INST], llama-3 headers); a plain fallback
// serves models without one.
#ifndef MOERT_MODEL_CHAT_TEMPLATE_H_
#define MOERT_MODEL_CHAT_TEMPLATE_H_

#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace moert::model {

// The prompt formats are llama.cpp's (llm_chat_apply_template): kChatMl is
// "chatml", kLlama2 is "llama2-sys" ([INST] turns, system text in <<SYS>> tags;
// used for Mistral / Mixtral [INST] templates too), kLlama3 is "llama3" (content
// trimmed). kPlain is moert's own: "role: content" lines, then "assistant:".
enum class ChatTemplateKind { kChatMl, kLlama2, kLlama3, kPlain };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The family of a tokenizer.chat_template text (or of a bare family name, as
// ChatTemplateFromName takes); an empty text gives kPlain. A non-empty template of
// no known family is InvalidArgument ("unknown chat template") unless
// `allow_plain_fallback`, which gives kPlain instead.
absl::StatusOr<ChatTemplateKind> DetectChatTemplate(std::string_view template_text,
                                                    bool allow_plain_fallback = true);

// By name: "chatml", "llama2", "llama3", "plain"; InvalidArgument otherwise.
absl::StatusOr<ChatTemplateKind> ChatTemplateFromName(std::string_view name);

// The prompt for `messages` (roles checked: InvalidArgument for an unknown role),
// ending with the assistant's turn opener when `add_assistant_prompt`. BOS is not
// included (the tokenizer adds it). kLlama2 prompts end with the assistant's
// opener ("[/INST]") already and ignore `add_assistant_prompt`, as in llama.cpp.
absl::StatusOr<std::string> ApplyChatTemplate(ChatTemplateKind kind,
                                              std::span<const ChatMessage> messages,
                                              bool add_assistant_prompt = true);

}  // namespace moert::model

#endif  // MOERT_MODEL_CHAT_TEMPLATE_H_
