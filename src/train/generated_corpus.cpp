// The generated corpus (fsdp/train/gpt_trainer.h: generated_corpus):
// what fsdp-train trains on without --data.
#include <random>
#include <string>

#include "fsdp/train/gpt_trainer.h"

namespace fsdp::train {

std::string generated_corpus(size_t bytes) {
  static const char* subjects[] = {"the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird",
                                   "the farmer", "our neighbour"};
  static const char* verbs[] = {"sees", "likes", "finds", "carries", "paints", "follows", "remembers", "keeps"};
  static const char* objects[] = {"the red ball", "a green apple", "the long road", "a quiet song", "the blue door",
                                  "a warm coat", "the river", "an old book"};
  static const char* endings[] = {"in the morning", "after dinner", "near the house", "every day", "with care",
                                  "at night"};
  std::mt19937 gen(1234);
  std::string out;
  while (out.size() < bytes) {
    out += subjects[gen() % 8];
    out += ' ';
    out += verbs[gen() % 8];
    out += ' ';
    out += objects[gen() % 8];
    out += ' ';
    out += endings[gen() % 6];
    out += ". ";
    if (gen() % 5 == 0) out += "\n";
  }
  out.resize(bytes);
  return out;
}

}  // namespace fsdp::train
