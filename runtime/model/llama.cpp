// Llama-family models (GGUF arch "llama"), including Mixtral's experts: GQA with a NORM-mode rope on the permuted
// q/k rows the converter writes, dense or routed SwiGLU FFN with softmax gating and normalised top-k weights.
#include "runtime/model/archs.h"
#include "runtime/model/gqa.h"

namespace hetmoe::model {

std::unique_ptr<Model> make_llama(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
  return make_gqa_model(std::move(file), std::move(config), n_threads, GqaOptions{.qk_norm = false});
}

}  // namespace hetmoe::model
