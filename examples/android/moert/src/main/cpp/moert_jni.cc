// The JNI glue of the Java API (org.moert.*) over moert's C API (moert/moert.h).
// Errors become org.moert.MoertException (the status code and the handle's message);
// an exception thrown by a Java callback stops the call and is rethrown to its caller.
// Strings cross as real UTF-8 <-> UTF-16 (JNI's "modified UTF-8" mangles characters
// outside the BMP, such as emoji a model may well emit).
#include <jni.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "moert/moert.h"

#ifdef __ANDROID__
#include <android/log.h>
#endif

namespace {

// Global references taken in JNI_OnLoad (FindClass from a callback thread would use
// the wrong class loader).
struct Classes {
  jclass exception = nullptr;  // org.moert.MoertException
  jmethodID exception_init = nullptr;
  jclass model_info = nullptr;
  jmethodID model_info_init = nullptr;
  jclass stats = nullptr;
  jmethodID stats_init = nullptr;
  jclass string = nullptr;
  jclass illegal_argument = nullptr;
};
Classes g_classes;

moert_runtime* Runtime(jlong h) { return reinterpret_cast<moert_runtime*>(static_cast<intptr_t>(h)); }
moert_session* SessionOf(jlong h) {
  return reinterpret_cast<moert_session*>(static_cast<intptr_t>(h));
}

// UTF-16 (a Java string) to UTF-8; lone surrogates become U+FFFD.
std::string ToUtf8(JNIEnv* env, jstring s) {
  std::string out;
  if (s == nullptr) return out;
  const jsize n = env->GetStringLength(s);
  const jchar* chars = env->GetStringChars(s, nullptr);
  if (chars == nullptr) return out;
  out.reserve(static_cast<size_t>(n));
  for (jsize i = 0; i < n; ++i) {
    uint32_t c = chars[i];
    if (c >= 0xD800 && c <= 0xDBFF && i + 1 < n && chars[i + 1] >= 0xDC00 &&
        chars[i + 1] <= 0xDFFF) {
      c = 0x10000 + ((c - 0xD800) << 10) + (uint32_t{chars[i + 1]} - 0xDC00);
      ++i;
    } else if (c >= 0xD800 && c <= 0xDFFF) {
      c = 0xFFFD;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  env->ReleaseStringChars(s, chars);
  return out;
}

// UTF-8 to a Java string; malformed bytes become U+FFFD. nullptr with an exception
// pending when out of memory.
jstring ToJava(JNIEnv* env, const char* utf8, size_t n) {
  std::vector<jchar> out;
  out.reserve(n);
  const auto* b = reinterpret_cast<const unsigned char*>(utf8);
  size_t i = 0;
  while (i < n) {
    uint32_t c = b[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    if (ok && len > 1) {
      c &= (0xFFu >> (len + 1));
      for (size_t k = 1; k < len; ++k) {
        if ((b[i + k] & 0xC0) != 0x80) ok = false;
        c = (c << 6) | (b[i + k] & 0x3Fu);
      }
      // Overlong forms, surrogates and values past U+10FFFF are malformed.
      if ((len == 2 && c < 0x80) || (len == 3 && c < 0x800) || (len == 4 && c < 0x10000) ||
          c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        ok = false;
      }
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    if (c >= 0x10000) {
      c -= 0x10000;
      out.push_back(static_cast<jchar>(0xD800 + (c >> 10)));
      out.push_back(static_cast<jchar>(0xDC00 + (c & 0x3FF)));
    } else {
      out.push_back(static_cast<jchar>(c));
    }
    i += len;
  }
  return env->NewString(out.data(), static_cast<jsize>(out.size()));
}

jstring ToJava(JNIEnv* env, const std::string& s) { return ToJava(env, s.data(), s.size()); }
jstring ToJava(JNIEnv* env, const char* s) {
  const std::string text = s != nullptr ? s : "";
  return ToJava(env, text);
}

// Throws MoertException(status, moert_status_string(status), message) unless OK.
// Returns true when it threw.
bool ThrowIfError(JNIEnv* env, moert_status status, const char* message) {
  if (status == MOERT_OK) return false;
  if (env->ExceptionCheck()) return true;  // a callback's exception goes first
  jstring name = ToJava(env, moert_status_string(status));
  jstring text = ToJava(env, message);
  if (name == nullptr || text == nullptr) return true;  // OutOfMemoryError pending
  auto exception = static_cast<jthrowable>(env->NewObject(
      g_classes.exception, g_classes.exception_init, static_cast<jint>(status), name, text));
  if (exception != nullptr) env->Throw(exception);
  return true;
}

bool ThrowIfError(JNIEnv* env, moert_runtime* rt, moert_status status) {
  return ThrowIfError(env, status, moert_last_error(rt));
}

bool ThrowIfError(JNIEnv* env, moert_session* s, moert_status status) {
  return ThrowIfError(env, status, moert_session_last_error(s));
}

std::vector<std::string> ToUtf8(JNIEnv* env, jobjectArray array) {
  std::vector<std::string> out;
  if (array == nullptr) return out;
  const jsize n = env->GetArrayLength(array);
  for (jsize i = 0; i < n; ++i) {
    auto element = static_cast<jstring>(env->GetObjectArrayElement(array, i));
    out.push_back(ToUtf8(env, element));
    env->DeleteLocalRef(element);
  }
  return out;
}

// A Java callback in flight: the env of the calling thread and the throwable the
// callback threw, if it did (held until the C call returns, then rethrown).
struct Callback {
  JNIEnv* env;
  jobject target;
  jmethodID method;
  jthrowable thrown = nullptr;

  // After the Java call: true when it threw (the exception is kept and cleared, so that
  // the C library can unwind, and the caller stops).
  bool Threw() {
    if (!env->ExceptionCheck()) return false;
    thrown = env->ExceptionOccurred();
    env->ExceptionClear();
    return true;
  }
  // Rethrows a kept exception; true when it did.
  bool Rethrow() {
    if (thrown == nullptr) return false;
    env->Throw(thrown);
    env->DeleteLocalRef(thrown);
    thrown = nullptr;
    return true;
  }
};

int OnProgress(float fraction, void* user_data) {
  auto* cb = static_cast<Callback*>(user_data);
  if (cb->thrown != nullptr) return 1;
  const jboolean go_on = cb->env->CallBooleanMethod(cb->target, cb->method, fraction);
  if (cb->Threw()) return 1;
  return go_on ? 0 : 1;
}

int OnToken(const char* piece, int32_t token, void* user_data) {
  auto* cb = static_cast<Callback*>(user_data);
  if (cb->thrown != nullptr) return 1;
  const std::string text = piece;
  jstring java_piece = ToJava(cb->env, text);
  if (java_piece == nullptr) {
    cb->Threw();
    return 1;
  }
  const jboolean go_on =
      cb->env->CallBooleanMethod(cb->target, cb->method, java_piece, static_cast<jint>(token));
  cb->env->DeleteLocalRef(java_piece);
  if (cb->Threw()) return 1;
  return go_on ? 0 : 1;
}

// Collects the generated text for generate()'s return value as it streams.
struct Generation {
  Callback* java = nullptr;  // nullptr: no Java callback
  std::string text;
};

int OnGenerated(const char* piece, int32_t token, void* user_data) {
  auto* g = static_cast<Generation*>(user_data);
  g->text += piece;
  return g->java != nullptr ? OnToken(piece, token, g->java) : 0;
}

#ifdef __ANDROID__
void ToLogcat(int level, const char* message, void*) {
  const int priority = level >= MOERT_LOG_ERROR     ? ANDROID_LOG_ERROR
                       : level >= MOERT_LOG_WARNING ? ANDROID_LOG_WARN
                       : level >= MOERT_LOG_INFO    ? ANDROID_LOG_INFO
                                                    : ANDROID_LOG_DEBUG;
  __android_log_write(priority, "moert", message);
}
#endif

// MoERuntime.setLogListener: the listener (a global reference) and its method; the
// mutex guards the swap, a message holds a local reference while it is delivered.
JavaVM* g_vm = nullptr;
std::mutex g_log_mutex;
jobject g_log_listener = nullptr;
jmethodID g_log_on_log = nullptr;

void ToListener(int level, const char* message, void*) {
  JNIEnv* env = nullptr;
  bool attached = false;
  if (g_vm->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_6) == JNI_EDETACHED) {
    // A library thread (the loader's, the prefetcher's): attached for this message only,
    // so that it never exits attached (ART aborts on that).
#ifdef __ANDROID__
    if (g_vm->AttachCurrentThread(&env, nullptr) != JNI_OK) return;
#else
    if (g_vm->AttachCurrentThread(reinterpret_cast<void**>(&env), nullptr) != JNI_OK) return;
#endif
    attached = true;
  }
  if (env == nullptr) return;
  jobject listener = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    if (g_log_listener != nullptr) listener = env->NewLocalRef(g_log_listener);
  }
  if (listener != nullptr) {
    // A message from inside a Java callback that threw: the exception stays pending for
    // its call to rethrow, and the message is not delivered (no JNI calls are allowed).
    if (!env->ExceptionCheck()) {
      jstring text = ToJava(env, message);
      if (text != nullptr) {
        env->CallVoidMethod(listener, g_log_on_log, static_cast<jint>(level), text);
        env->DeleteLocalRef(text);
      }
      if (env->ExceptionCheck()) env->ExceptionClear();  // a listener that throws is dropped
    }
    env->DeleteLocalRef(listener);
  }
  if (attached) g_vm->DetachCurrentThread();
}

jclass GlobalClass(JNIEnv* env, const char* name) {
  jclass local = env->FindClass(name);
  if (local == nullptr) return nullptr;
  auto global = static_cast<jclass>(env->NewGlobalRef(local));
  env->DeleteLocalRef(local);
  return global;
}

}  // namespace

extern "C" {

JNIEXPORT jint JNI_OnLoad(JavaVM* vm, void*) {
  JNIEnv* env = nullptr;
  if (vm->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_6) != JNI_OK) return JNI_ERR;
  g_vm = vm;
  // A libmoert.so of another ABI than the glue was built against fails here, clearly.
  if (moert_check_abi(MOERT_ABI_VERSION) != MOERT_OK) {
    jclass error = env->FindClass("java/lang/UnsatisfiedLinkError");
    if (error != nullptr) env->ThrowNew(error, moert_last_error(nullptr));
    return JNI_ERR;
  }
  g_classes.exception = GlobalClass(env, "org/moert/MoertException");
  g_classes.model_info = GlobalClass(env, "org/moert/ModelInfo");
  g_classes.stats = GlobalClass(env, "org/moert/Stats");
  g_classes.string = GlobalClass(env, "java/lang/String");
  if (g_classes.exception == nullptr || g_classes.model_info == nullptr ||
      g_classes.stats == nullptr || g_classes.string == nullptr) {
    return JNI_ERR;
  }
  g_classes.exception_init = env->GetMethodID(g_classes.exception, "<init>",
                                              "(ILjava/lang/String;Ljava/lang/String;)V");
  g_classes.model_info_init =
      env->GetMethodID(g_classes.model_info, "<init>", "([Ljava/lang/String;[JD)V");
  g_classes.stats_init = env->GetMethodID(g_classes.stats, "<init>", "([J[DLjava/lang/String;)V");
  if (g_classes.exception_init == nullptr || g_classes.model_info_init == nullptr ||
      g_classes.stats_init == nullptr) {
    return JNI_ERR;
  }
#ifdef __ANDROID__
  moert_set_log_callback(ToLogcat, nullptr, MOERT_LOG_INFO);
#endif
  return JNI_VERSION_1_6;
}

JNIEXPORT jstring JNICALL Java_org_moert_MoERuntime_version(JNIEnv* env, jclass) {
  return ToJava(env, moert_version());
}

JNIEXPORT void JNICALL Java_org_moert_MoERuntime_nativeSetLogListener(JNIEnv* env, jclass,
                                                                      jobject listener,
                                                                      jint min_level) {
  if (listener != nullptr && g_log_on_log == nullptr) {
    jclass type = env->FindClass("org/moert/LogListener");
    if (type == nullptr) return;  // NoClassDefFoundError pending
    g_log_on_log = env->GetMethodID(type, "onLog", "(ILjava/lang/String;)V");
    env->DeleteLocalRef(type);
    if (g_log_on_log == nullptr) return;  // NoSuchMethodError pending
  }
  moert_log_callback callback = nullptr;
  if (listener != nullptr) {
    callback = ToListener;
  } else {
#ifdef __ANDROID__
    callback = ToLogcat;
#endif
  }
  if (min_level < MOERT_LOG_DEBUG || min_level > MOERT_LOG_ERROR) {
    ThrowIfError(env, MOERT_INVALID_ARGUMENT,
                 ("setLogListener: minLevel " + std::to_string(min_level) +
                  " is not a LogListener level (DEBUG 0 .. ERROR 3)").c_str());
    return;
  }
  // The listener first, then the callback: a message between the two goes to the old
  // listener, the new one or nowhere, never to a freed reference.
  jobject fresh = listener != nullptr ? env->NewGlobalRef(listener) : nullptr;
  jobject old = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    old = g_log_listener;
    g_log_listener = fresh;
  }
  if (old != nullptr) env->DeleteGlobalRef(old);
  ThrowIfError(env, moert_set_log_callback(callback, nullptr, min_level),
               moert_last_error(nullptr));
}

JNIEXPORT jint JNICALL Java_org_moert_MoERuntime_abiVersion(JNIEnv*, jclass) {
  return moert_abi_version();
}

JNIEXPORT jlong JNICALL Java_org_moert_MoERuntime_nativeCreate(JNIEnv* env, jclass, jint threads,
                                                               jint context_length, jlong budget,
                                                               jdouble pool_fraction,
                                                               jstring cache_dir, jint backend,
                                                               jboolean mlock) {
  moert_runtime_options options;
  moert_runtime_options_default(&options);
  options.threads = threads;
  options.context_length = context_length;
  moert_runtime* rt = nullptr;
  const moert_status created = moert_runtime_create(&options, &rt);
  if (ThrowIfError(env, created, moert_last_error(nullptr))) return 0;
  const std::string dir = ToUtf8(env, cache_dir);
  moert_status status = moert_runtime_set_memory_budget(rt, budget);
  if (status == MOERT_OK) status = moert_runtime_set_expert_pool_fraction(rt, pool_fraction);
  if (status == MOERT_OK && cache_dir != nullptr) {
    status = moert_runtime_set_cache_dir(rt, dir.c_str());
  }
  if (status == MOERT_OK) {
    status = moert_runtime_set_backend(rt, static_cast<moert_backend>(backend));
  }
  if (status == MOERT_OK) status = moert_runtime_set_mlock(rt, mlock ? 1 : 0);
  if (ThrowIfError(env, rt, status)) {
    moert_runtime_destroy(rt);
    return 0;
  }
  return static_cast<jlong>(reinterpret_cast<intptr_t>(rt));
}

JNIEXPORT void JNICALL Java_org_moert_MoERuntime_nativeLoad(JNIEnv* env, jclass, jlong h,
                                                            jstring path, jint fd, jlong offset,
                                                            jlong length, jobject listener) {
  moert_runtime* rt = Runtime(h);
  Callback cb{env, listener, nullptr};
  if (listener != nullptr) {
    jclass type = env->GetObjectClass(listener);
    cb.method = env->GetMethodID(type, "onProgress", "(F)Z");
    env->DeleteLocalRef(type);
    if (cb.method == nullptr) return;  // NoSuchMethodError pending
  }
  moert_cancellable_progress_callback progress = listener != nullptr ? OnProgress : nullptr;
  moert_status status;
  if (path != nullptr) {
    const std::string file = ToUtf8(env, path);
    status = moert_runtime_load_model_cancellable(rt, file.c_str(), progress, &cb);
  } else {
    status = moert_runtime_load_model_fd(rt, fd, offset, length, progress, &cb);
  }
  if (cb.Rethrow()) return;
  ThrowIfError(env, rt, status);
}

// The int inside a java.io.FileDescriptor. The field is private and differs by runtime:
// `descriptor` on Android (libcore), `fd` on OpenJDK; JNI reads it either way. On
// Android it is a non-SDK field on the greylist (apps may read it, ART may log that; not
// tried on a device here); the NDK's AFileDescriptor_getFd would need API 31.
JNIEXPORT jint JNICALL Java_org_moert_MoERuntime_nativeDescriptorOf(JNIEnv* env, jclass,
                                                                    jobject descriptor) {
  if (descriptor == nullptr) {
    ThrowIfError(env, MOERT_INVALID_ARGUMENT, "loadModel: the FileDescriptor is null");
    return -1;
  }
  jclass type = env->GetObjectClass(descriptor);
  jfieldID field = nullptr;
  for (const char* name : {"descriptor", "fd"}) {
    field = env->GetFieldID(type, name, "I");
    if (field != nullptr) break;
    env->ExceptionClear();  // NoSuchFieldError: try the other runtime's name
  }
  env->DeleteLocalRef(type);
  if (field == nullptr) {
    ThrowIfError(env, MOERT_INVALID_ARGUMENT,
                 "loadModel: this java.io.FileDescriptor has no int field 'descriptor' "
                 "(Android) or 'fd' (OpenJDK) to read the file descriptor from: pass "
                 "ParcelFileDescriptor.getFd() to loadModel(int, ...) instead");
    return -1;
  }
  const jint fd = env->GetIntField(descriptor, field);
  if (fd < 0) {
    ThrowIfError(env, MOERT_INVALID_ARGUMENT,
                 ("loadModel: the FileDescriptor is not valid (its descriptor is " +
                  std::to_string(fd) + "): closed, or never opened")
                     .c_str());
    return -1;
  }
  return fd;
}

JNIEXPORT void JNICALL Java_org_moert_MoERuntime_nativeLoadMmproj(JNIEnv* env, jclass, jlong h,
                                                                  jstring path) {
  const std::string file = ToUtf8(env, path);
  ThrowIfError(env, Runtime(h), moert_runtime_load_mmproj(Runtime(h), file.c_str()));
}

JNIEXPORT jobject JNICALL Java_org_moert_MoERuntime_nativeModelInfo(JNIEnv* env, jclass,
                                                                    jlong h) {
  moert_model_details info;
  if (ThrowIfError(env, Runtime(h), moert_model_info(Runtime(h), &info))) return nullptr;
  const char* strings[] = {info.architecture, info.name, info.chat_template, info.backend,
                           info.device};
  jobjectArray s = env->NewObjectArray(5, g_classes.string, nullptr);
  if (s == nullptr) return nullptr;
  for (jsize i = 0; i < 5; ++i) {
    jstring text = ToJava(env, strings[i]);
    if (text == nullptr) return nullptr;
    env->SetObjectArrayElement(s, i, text);
    env->DeleteLocalRef(text);
  }
  const jlong numbers[] = {info.parameters,       info.layers,
                           info.embedding_length, info.experts,
                           info.experts_used,     info.vocab_size,
                           info.training_context_length, info.context_length,
                           info.file_offset};
  jlongArray n = env->NewLongArray(9);
  if (n == nullptr) return nullptr;
  env->SetLongArrayRegion(n, 0, 9, numbers);
  return env->NewObject(g_classes.model_info, g_classes.model_info_init, s, n, info.load_ms);
}

JNIEXPORT void JNICALL Java_org_moert_MoERuntime_nativeTrim(JNIEnv* env, jclass, jlong h,
                                                            jint level) {
  // Any thread: its error is the thread's (moert_last_error(NULL)), not the handle's.
  const moert_status status = moert_runtime_trim(Runtime(h), level);
  ThrowIfError(env, status, moert_last_error(nullptr));
}

JNIEXPORT jlong JNICALL Java_org_moert_MoERuntime_nativeNewSession(JNIEnv* env, jclass, jlong h) {
  moert_session* session = nullptr;
  if (ThrowIfError(env, Runtime(h), moert_session_create(Runtime(h), &session))) return 0;
  return static_cast<jlong>(reinterpret_cast<intptr_t>(session));
}

JNIEXPORT jstring JNICALL Java_org_moert_MoERuntime_nativeMetrics(JNIEnv* env, jclass, jlong h) {
  const int64_t n = moert_runtime_metrics(Runtime(h), nullptr, 0);
  if (n < 0) return ToJava(env, "");
  std::string text(static_cast<size_t>(n) + 1, '\0');
  const int64_t written = moert_runtime_metrics(Runtime(h), text.data(), text.size());
  text.resize(written < 0 ? 0 : std::min(static_cast<size_t>(written), text.size() - 1));
  return ToJava(env, text);
}

JNIEXPORT void JNICALL Java_org_moert_MoERuntime_nativeDestroy(JNIEnv*, jclass, jlong h) {
  moert_runtime_destroy(Runtime(h));
}

JNIEXPORT void JNICALL Java_org_moert_Session_nativeAddMessage(JNIEnv* env, jclass, jlong h,
                                                               jstring role, jstring content) {
  const std::string r = ToUtf8(env, role);
  const std::string c = ToUtf8(env, content);
  ThrowIfError(env, SessionOf(h), moert_session_add_message(SessionOf(h), r.c_str(), c.c_str()));
}

JNIEXPORT void JNICALL Java_org_moert_Session_nativeAddImageFile(JNIEnv* env, jclass, jlong h,
                                                                 jstring path) {
  const std::string file = ToUtf8(env, path);
  ThrowIfError(env, SessionOf(h), moert_session_add_image(SessionOf(h), file.c_str()));
}

JNIEXPORT void JNICALL Java_org_moert_Session_nativeAddImageBytes(JNIEnv* env, jclass, jlong h,
                                                                  jbyteArray bytes) {
  if (bytes == nullptr) {
    ThrowIfError(env, MOERT_INVALID_ARGUMENT, "addImage: the image bytes are null");
    return;
  }
  const jsize n = env->GetArrayLength(bytes);
  std::vector<uint8_t> data(static_cast<size_t>(n));
  env->GetByteArrayRegion(bytes, 0, n, reinterpret_cast<jbyte*>(data.data()));
  ThrowIfError(env, SessionOf(h),
               moert_session_add_image_bytes(SessionOf(h), data.data(), data.size()));
}

JNIEXPORT jstring JNICALL Java_org_moert_Session_nativeGenerate(
    JNIEnv* env, jclass, jlong h, jstring prompt, jobjectArray roles, jobjectArray contents,
    jint max_tokens, jfloat temperature, jint top_k, jfloat top_p, jfloat min_p,
    jfloat repeat_penalty, jint repeat_last_n, jlong seed, jobjectArray stop,
    jstring chat_template, jboolean slide, jfloat image_keep_ratio, jint image_min_keep,
    jobject callback) {
  moert_session* session = SessionOf(h);
  const std::string prompt_text = ToUtf8(env, prompt);
  const std::vector<std::string> role_texts = ToUtf8(env, roles);
  const std::vector<std::string> content_texts = ToUtf8(env, contents);
  const std::vector<std::string> stop_texts = ToUtf8(env, stop);
  const std::string template_name = ToUtf8(env, chat_template);
  if (role_texts.size() != content_texts.size()) {
    ThrowIfError(env, MOERT_INVALID_ARGUMENT, "generate: roles and contents differ in number");
    return nullptr;
  }
  std::vector<moert_message> messages;
  for (size_t i = 0; i < role_texts.size(); ++i) {
    messages.push_back({role_texts[i].c_str(), content_texts[i].c_str()});
  }
  std::vector<const char*> stops;
  for (const std::string& s : stop_texts) stops.push_back(s.c_str());

  moert_generate_params params;
  moert_generate_params_default(&params);
  params.prompt = prompt != nullptr ? prompt_text.c_str() : nullptr;
  params.messages = messages.empty() ? nullptr : messages.data();
  params.n_messages = messages.size();
  params.max_tokens = max_tokens;
  params.sampler.temperature = temperature;
  params.sampler.top_k = top_k;
  params.sampler.top_p = top_p;
  params.sampler.min_p = min_p;
  params.sampler.repeat_penalty = repeat_penalty;
  params.sampler.repeat_last_n = repeat_last_n;
  params.sampler.seed = static_cast<uint64_t>(seed);
  params.stop = stops.empty() ? nullptr : stops.data();
  params.n_stop = stops.size();
  params.chat_template = chat_template != nullptr ? template_name.c_str() : nullptr;
  params.context_policy = slide ? MOERT_CONTEXT_SLIDE : MOERT_CONTEXT_ERROR;
  params.image_keep_ratio = image_keep_ratio;
  params.image_min_keep = image_min_keep;

  Callback java{env, callback, nullptr};
  Generation generation;
  if (callback != nullptr) {
    jclass type = env->GetObjectClass(callback);
    java.method = env->GetMethodID(type, "onToken", "(Ljava/lang/String;I)Z");
    env->DeleteLocalRef(type);
    if (java.method == nullptr) return nullptr;  // NoSuchMethodError pending
    generation.java = &java;
  }
  const moert_status status = moert_session_generate(session, &params, OnGenerated, &generation);
  if (java.Rethrow()) return nullptr;
  if (ThrowIfError(env, session, status)) return nullptr;
  return ToJava(env, generation.text);
}

JNIEXPORT void JNICALL Java_org_moert_Session_nativeCancel(JNIEnv*, jclass, jlong h) {
  moert_session_cancel(SessionOf(h));
}

JNIEXPORT void JNICALL Java_org_moert_Session_nativeReset(JNIEnv* env, jclass, jlong h) {
  ThrowIfError(env, SessionOf(h), moert_session_reset(SessionOf(h)));
}

JNIEXPORT jobject JNICALL Java_org_moert_Session_nativeStats(JNIEnv* env, jclass, jlong h) {
  moert_stats s;
  moert_memory_stats m;
  if (ThrowIfError(env, SessionOf(h), moert_session_stats(SessionOf(h), &s))) return nullptr;
  if (ThrowIfError(env, SessionOf(h), moert_session_memory_stats(SessionOf(h), &m))) {
    return nullptr;
  }
  const jlong numbers[] = {s.prompt_tokens,     s.cached_tokens,       s.prefill_tokens,
                           s.generated_tokens,  s.finish_reason,       s.images,
                           s.image_tokens,      s.degraded,            s.peak_rss_bytes,
                           m.budget_bytes,      m.expert_pool_bytes,   m.expert_pool_used_bytes,
                           m.kv_cache_bytes};
  const jdouble doubles[] = {s.prefill_ms,
                             s.decode_ms,
                             s.time_to_first_token_ms,
                             s.prefill_tokens_per_second,
                             s.decode_tokens_per_second,
                             s.image_encode_ms,
                             s.prefetch_precision,
                             s.prefetch_recall,
                             m.expert_hit_rate,
                             m.expert_bytes_read_per_token,
                             m.expert_stall_ms_per_token};
  constexpr jsize kNumbers = sizeof(numbers) / sizeof(numbers[0]);
  constexpr jsize kDoubles = sizeof(doubles) / sizeof(doubles[0]);
  jlongArray n = env->NewLongArray(kNumbers);
  jdoubleArray d = env->NewDoubleArray(kDoubles);
  jstring reason = ToJava(env, s.degrade_reason);
  if (n == nullptr || d == nullptr || reason == nullptr) return nullptr;
  env->SetLongArrayRegion(n, 0, kNumbers, numbers);
  env->SetDoubleArrayRegion(d, 0, kDoubles, doubles);
  return env->NewObject(g_classes.stats, g_classes.stats_init, n, d, reason);
}

JNIEXPORT void JNICALL Java_org_moert_Session_nativeDestroy(JNIEnv*, jclass, jlong h) {
  moert_session_destroy(SessionOf(h));
}

}  // extern "C"
