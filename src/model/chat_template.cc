// Chat templates: detection from the GGUF Jinja text by marker strings and prompt
// rendering for the supported families, matching llama.cpp's
// llm_chat_apply_template byte for byte (no Jinja interpreter).
#include "model/chat_template.h"

#include "core/strings.h"

namespace moert::model {
namespace {

bool Contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

// Whitespace as C's isspace sees it in the "C" locale.
std::string_view Trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\v\f\r";
  const size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(kSpace);
  return text.substr(begin, end - begin + 1);
}

absl::Status CheckRoles(std::span<const ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(StrCat("chat message ", i, " has unknown role \"", role,
                                               "\" (expected system, user or assistant)"));
    }
  }
  return absl::OkStatus();
}

// <|im_start|>role\ncontent<|im_end|>\n per message (Qwen, many others).
std::string ApplyChatMl(std::span<const ChatMessage> messages, bool add_assistant) {
  std::string out;
  for (const ChatMessage& m : messages) {
    StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  }
  if (add_assistant) out += "<|im_start|>assistant\n";
  return out;
}

// llama.cpp's "llama2-sys": a user turn is "[INST] ... [/INST]", the system text
// goes into the next turn inside <<SYS>> tags, an assistant answer ends with </s>
// and the next turn reopens [INST]. The prompt already ends with the assistant's
// opener ("[/INST]"), so `add_assistant` adds nothing, as in llama.cpp.
std::string ApplyLlama2(std::span<const ChatMessage> messages) {
  std::string out = "[INST] ";
  bool inside_turn = true;  // the first [INST] is written already
  for (const ChatMessage& m : messages) {
    if (!inside_turn) {
      out += "[INST] ";
      inside_turn = true;
    }
    if (m.role == "system") {
      StrAppend(&out, "<<SYS>>\n", m.content, "\n<</SYS>>\n\n");
    } else if (m.role == "user") {
      StrAppend(&out, m.content, " [/INST]");
    } else {
      StrAppend(&out, m.content, "</s>");
      inside_turn = false;
    }
  }
  return out;
}

// Llama-3 headers; the content is trimmed, as the official template (| trim) does.
std::string ApplyLlama3(std::span<const ChatMessage> messages, bool add_assistant) {
  std::string out;
  for (const ChatMessage& m : messages) {
    StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n", Trim(m.content),
              "<|eot_id|>");
  }
  if (add_assistant) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// moert's own fallback for models without a template: "role: content" lines and
// "assistant:" (no trailing space, which would tokenize badly) to open the answer.
std::string ApplyPlain(std::span<const ChatMessage> messages, bool add_assistant) {
  std::string out;
  for (const ChatMessage& m : messages) StrAppend(&out, m.role, ": ", m.content, "\n");
  if (add_assistant) out += "assistant:";
  return out;
}

}  // namespace

absl::StatusOr<ChatTemplateKind> DetectChatTemplate(std::string_view template_text,
                                                    bool allow_plain_fallback) {
  if (template_text.empty()) return ChatTemplateKind::kPlain;
  // A bare family name stands for itself, as in llama.cpp.
  absl::StatusOr<ChatTemplateKind> by_name = ChatTemplateFromName(template_text);
  if (by_name.ok()) return by_name;

  // Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) use <|im_start|> but are
  // not ChatML; they fall through to "unknown".
  if (Contains(template_text, "<|im_start|>") && !Contains(template_text, "<|im_sep|>") &&
      !Contains(template_text, "<end_of_utterance>")) {
    return ChatTemplateKind::kChatMl;
  }
  // Llama-2 and the Mistral / Mixtral [INST] templates. The Mistral v3 / v7
  // spacing variants ([AVAILABLE_TOOLS], [SYSTEM_PROMPT]) are rendered the
  // llama-2 way too: close to, not exactly, their own format.
  if (template_text.starts_with("mistral") || Contains(template_text, "[INST]")) {
    return ChatTemplateKind::kLlama2;
  }
  if (Contains(template_text, "<|start_header_id|>") &&
      Contains(template_text, "<|end_header_id|>")) {
    return ChatTemplateKind::kLlama3;
  }
  if (allow_plain_fallback) return ChatTemplateKind::kPlain;
  return absl::InvalidArgumentError(StrCat("unknown chat template (", template_text.size(),
                                           " bytes; known: ChatML, llama-2 [INST], llama-3)"));
}

absl::StatusOr<ChatTemplateKind> ChatTemplateFromName(std::string_view name) {
  if (name == "chatml") return ChatTemplateKind::kChatMl;
  if (name == "llama2") return ChatTemplateKind::kLlama2;
  if (name == "llama3") return ChatTemplateKind::kLlama3;
  if (name == "plain") return ChatTemplateKind::kPlain;
  return absl::InvalidArgumentError(StrCat("unknown chat template name \"", name,
                                           "\" (expected chatml, llama2, llama3 or plain)"));
}

absl::StatusOr<std::string> ApplyChatTemplate(ChatTemplateKind kind,
                                              std::span<const ChatMessage> messages,
                                              bool add_assistant_prompt) {
  absl::Status status = CheckRoles(messages);
  if (!status.ok()) return status;
  switch (kind) {
    case ChatTemplateKind::kChatMl:
      return ApplyChatMl(messages, add_assistant_prompt);
    case ChatTemplateKind::kLlama2:
      return ApplyLlama2(messages);
    case ChatTemplateKind::kLlama3:
      return ApplyLlama3(messages, add_assistant_prompt);
    case ChatTemplateKind::kPlain:
      return ApplyPlain(messages, add_assistant_prompt);
  }
  return absl::InvalidArgumentError(StrCat("invalid ChatTemplateKind ", static_cast<int>(kind)));
}

}  // namespace moert::model
