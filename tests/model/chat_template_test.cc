// Tests of chat template detection (on template texts as GGUF files carry them)
// and of the prompts each family renders, written out literally.
#include "model/chat_template.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moert::model {
namespace {

using ::testing::HasSubstr;

// Qwen2 / Qwen2-MoE tokenizer.chat_template.
constexpr char kQwen2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
    "'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' "
    "}}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

// Meta-Llama-3-8B-Instruct.
constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set "
    "content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set "
    "content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' "
    "}}{% endif %}";

// Llama-2-7b-chat.
constexpr char kLlama2Template[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set "
    "loop_messages = messages %}{% set system_message = false %}{% endif %}{% for "
    "message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % "
    "2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
    "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token "
    "+ '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% "
    "endfor %}";

// Mixtral-8x7B-Instruct-v0.1.
constexpr char kMixtralTemplate[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') "
    "!= (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% "
    "else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}";

// Gemma: a family moert does not render.
constexpr char kGemmaTemplate[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == "
    "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] "
    "%}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>"
    "model\n'}}{% endif %}";

// Phi-4 uses <|im_start|> but is not ChatML.
constexpr char kPhi4Template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
    "'<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}";

std::vector<ChatMessage> Conversation() {
  return {
      {"system", "You are a helpful assistant."},
      {"user", "Hello!"},
      {"assistant", "Hi! How can I help?"},
      {"user", "What is 2+2?"},
  };
}

std::string Apply(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                  bool add_assistant_prompt = true) {
  absl::StatusOr<std::string> prompt = ApplyChatTemplate(kind, messages, add_assistant_prompt);
  EXPECT_TRUE(prompt.ok()) << prompt.status();
  return prompt.ok() ? *prompt : std::string();
}

TEST(ChatTemplateTest, DetectsTheKnownFamilies) {
  EXPECT_EQ(DetectChatTemplate(kQwen2Template).value(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(DetectChatTemplate(kLlama3Template).value(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(DetectChatTemplate(kLlama2Template).value(), ChatTemplateKind::kLlama2);
  EXPECT_EQ(DetectChatTemplate(kMixtralTemplate).value(), ChatTemplateKind::kLlama2);
  // Strict detection agrees on the known families.
  EXPECT_EQ(DetectChatTemplate(kQwen2Template, false).value(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(DetectChatTemplate(kLlama3Template, false).value(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(DetectChatTemplate(kLlama2Template, false).value(), ChatTemplateKind::kLlama2);
}

TEST(ChatTemplateTest, EmptyTemplateIsPlain) {
  EXPECT_EQ(DetectChatTemplate("").value(), ChatTemplateKind::kPlain);
  EXPECT_EQ(DetectChatTemplate("", false).value(), ChatTemplateKind::kPlain);
}

TEST(ChatTemplateTest, BareNamesAreDetected) {
  EXPECT_EQ(DetectChatTemplate("chatml", false).value(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(DetectChatTemplate("llama3", false).value(), ChatTemplateKind::kLlama3);
}

TEST(ChatTemplateTest, UnknownTemplates) {
  for (const char* text : {kGemmaTemplate, kPhi4Template, "{{ messages }}"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<ChatTemplateKind> strict = DetectChatTemplate(text, false);
    EXPECT_EQ(strict.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(strict.status().message()), HasSubstr("unknown chat template"));
    EXPECT_EQ(DetectChatTemplate(text).value(), ChatTemplateKind::kPlain);
    EXPECT_EQ(DetectChatTemplate(text, true).value(), ChatTemplateKind::kPlain);
  }
}

TEST(ChatTemplateTest, FromName) {
  EXPECT_EQ(ChatTemplateFromName("chatml").value(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(ChatTemplateFromName("llama2").value(), ChatTemplateKind::kLlama2);
  EXPECT_EQ(ChatTemplateFromName("llama3").value(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(ChatTemplateFromName("plain").value(), ChatTemplateKind::kPlain);
  for (const char* name : {"", "ChatML", "gemma", "llama-3"}) {
    absl::StatusOr<ChatTemplateKind> kind = ChatTemplateFromName(name);
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(kind.status().message()), HasSubstr(std::string("\"") + name + "\""));
  }
}

TEST(ChatTemplateTest, ChatMlPrompt) {
  EXPECT_EQ(Apply(ChatTemplateKind::kChatMl, Conversation()),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3Prompt) {
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama3, Conversation()),
            "<|start_header_id|>system<|end_header_id|>\n\n"
            "You are a helpful assistant.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            "Hi! How can I help?<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Llama2Prompt) {
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama2, Conversation()),
            "[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n"
            "Hello! [/INST]Hi! How can I help?</s>"
            "[INST] What is 2+2? [/INST]");
}

TEST(ChatTemplateTest, PlainPrompt) {
  EXPECT_EQ(Apply(ChatTemplateKind::kPlain, Conversation()),
            "system: You are a helpful assistant.\n"
            "user: Hello!\n"
            "assistant: Hi! How can I help?\n"
            "user: What is 2+2?\n"
            "assistant:");
}

TEST(ChatTemplateTest, WithoutTheAssistantPrompt) {
  const std::vector<ChatMessage> messages = {{"user", "Hi"}, {"assistant", "Hello"}};
  EXPECT_EQ(Apply(ChatTemplateKind::kChatMl, messages, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n");
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama3, messages, false),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>");
  EXPECT_EQ(Apply(ChatTemplateKind::kPlain, messages, false), "user: Hi\nassistant: Hello\n");
  // llama-2 has no separate assistant opener: the flag changes nothing.
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama2, messages, false), "[INST] Hi [/INST]Hello</s>");
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama2, messages, true), "[INST] Hi [/INST]Hello</s>");
}

TEST(ChatTemplateTest, Llama3TrimsContentOthersKeepIt) {
  const std::vector<ChatMessage> messages = {{"user", "  Hi there \n"}};
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama3, messages),
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Apply(ChatTemplateKind::kChatMl, messages),
            "<|im_start|>user\n  Hi there \n<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama2, messages), "[INST]   Hi there \n [/INST]");
}

TEST(ChatTemplateTest, Llama2WithoutSystemMessage) {
  const std::vector<ChatMessage> messages = {
      {"user", "One?"}, {"assistant", "1"}, {"user", "Two?"}};
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama2, messages),
            "[INST] One? [/INST]1</s>[INST] Two? [/INST]");
}

TEST(ChatTemplateTest, EmptyConversation) {
  const std::vector<ChatMessage> none;
  EXPECT_EQ(Apply(ChatTemplateKind::kChatMl, none), "<|im_start|>assistant\n");
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama3, none),
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Apply(ChatTemplateKind::kLlama2, none), "[INST] ");
  EXPECT_EQ(Apply(ChatTemplateKind::kPlain, none), "assistant:");
  EXPECT_EQ(Apply(ChatTemplateKind::kChatMl, none, false), "");
}

TEST(ChatTemplateTest, UnknownRoleIsAnError) {
  const std::vector<ChatMessage> messages = {{"user", "Hi"}, {"tool", "{}"}};
  for (ChatTemplateKind kind : {ChatTemplateKind::kChatMl, ChatTemplateKind::kLlama2,
                                ChatTemplateKind::kLlama3, ChatTemplateKind::kPlain}) {
    absl::StatusOr<std::string> prompt = ApplyChatTemplate(kind, messages);
    EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(prompt.status().message()), HasSubstr("\"tool\""));
    EXPECT_THAT(std::string(prompt.status().message()), HasSubstr("message 1"));
  }
  EXPECT_FALSE(
      ApplyChatTemplate(ChatTemplateKind::kChatMl, std::vector<ChatMessage>{{"User", "Hi"}}).ok());
}

}  // namespace
}  // namespace moert::model
