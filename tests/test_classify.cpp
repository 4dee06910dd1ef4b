// The classifier example's library: TSV reading, a small task learned through train::train_loop,
// predictions independent of the padding their batch needed, and the metrics.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "examples/classify/classify.h"
#include "examples/classify/naive_bayes.h"
#include "examples/classify/pretrained.h"
#include "examples/common/train_task.h"
#include "graft/autograd/tape.h"
#include "graft/models/bert.h"
#include "graft/nn/train/checkpoint.h"
#include "tests/nan_weight.h"
#include "tests/test_util.h"

using namespace graft;
using graft::testing::names;
namespace fs = std::filesystem;

using graft::testing::TempDir;

BOOST_AUTO_TEST_SUITE(classify_example)

BOOST_AUTO_TEST_CASE(tsv_reading_and_errors) {
  const TempDir dir("classify_tsv");
  const fs::path d = dir.path;
  std::ofstream(d / "ok.tsv") << "de\tEin Satz.\r\n\n en \t  a sentence \n"
                              << "x\t" << std::string(200, 'a') << "\n";
  auto ex = classify::read_tsv((d / "ok.tsv").string());
  BOOST_TEST(ex.size() == 3u);
  BOOST_TEST(ex[0].label == "de");
  BOOST_TEST(ex[1].label == "en");
  BOOST_TEST(ex[1].text == "a sentence");
  BOOST_TEST(ex[2].text.size() == 200u);  // whole: each model cuts texts to its own input length
  // The byte model's cut: a multi-byte character straddling it is dropped whole.
  BOOST_TEST(classify::cut_utf8(std::string(159, 'a') + "é", 160) == std::string(159, 'a'));
  BOOST_TEST(classify::cut_utf8("abc", 160) == "abc");
  std::ofstream(d / "bad.tsv") << "de\tok\nno tab here\n";
  BOOST_CHECK_EXCEPTION(classify::read_tsv((d / "bad.tsv").string()), Error, [](const Error& e) {
    return names(e, "bad.tsv' line 2: expected label<TAB>text");
  });
  BOOST_CHECK_EXCEPTION(classify::read_tsv((d / "missing.tsv").string()), Error,
                        [](const Error& e) { return names(e, "cannot read"); });
  // A device never ends: refused before the first byte is read.
  fs::create_symlink("/dev/zero", d / "zero.tsv");
  BOOST_CHECK_EXCEPTION(classify::read_tsv((d / "zero.tsv").string()), Error,
                        [](const Error& e) { return names(e, "zero.tsv' is not a regular file"); });
}

// Labels: at most kMaxLabels distinct ones (a TSV of 100,000 once ran for minutes before step
// 1), looked up through a hash map built once.
BOOST_AUTO_TEST_CASE(labels_are_limited_and_indexed) {
  std::vector<classify::Example> data;
  for (size_t i = 0; i < classify::kMaxLabels; ++i) data.push_back({std::to_string(i), "text"});
  data.push_back({"7", "again"});
  const std::vector<std::string> labels = classify::labels_of(data, "d/train.tsv");
  BOOST_TEST(labels.size() == classify::kMaxLabels);
  BOOST_TEST(std::is_sorted(labels.begin(), labels.end()));
  const classify::LabelIndex index(labels);
  for (size_t i = 0; i < labels.size(); ++i) BOOST_TEST(index(labels[i]) == (int64_t)i);
  BOOST_CHECK_EXCEPTION(index("nope"), Error,
                        [](const Error& e) { return names(e, "label 'nope' is not one of"); });
  data.push_back({"one more", "text"});
  BOOST_CHECK_EXCEPTION(classify::labels_of(data, "d/train.tsv"), Error, [](const Error& e) {
    return names(e, "'d/train.tsv' has more than 1024 distinct labels, the most a run may have");
  });
  // Through train(): refused before the model is built.
  const TempDir dir("classify_labels");
  const fs::path d = dir.path;
  classify::write_tsv((d / "train.tsv").string(), data);
  classify::write_tsv((d / "valid.tsv").string(), data);
  classify::TrainOptions o;
  o.data_dir = d.string(), o.loop.run_dir = (d / "run").string(), o.loop.steps = 1,
  o.loop.quiet = true;
  BOOST_CHECK_EXCEPTION(classify::train(o), Error,
                        [](const Error& e) { return names(e, "distinct labels"); });
}

BOOST_AUTO_TEST_CASE(learns_a_small_task_and_predicts_without_padding_effects) {
  const TempDir dir("classify_task");
  const fs::path d = dir.path;
  std::vector<classify::Example> train, valid;
  Generator g(4);
  auto word = [&](const char* letters) {
    std::string w;
    const int n = 3 + (int)g.below(9);
    for (int i = 0; i < n; ++i) w.push_back(letters[g.below(4)]);
    return w;
  };
  for (int i = 0; i < 200; ++i) {
    (i % 5 ? train : valid).push_back({"vowel", word("aeio")});
    (i % 5 ? train : valid).push_back({"consonant", word("tkpr")});
  }
  classify::write_tsv((d / "train.tsv").string(), train);
  classify::write_tsv((d / "valid.tsv").string(), valid);
  classify::TrainOptions o;
  o.data_dir = d.string();
  o.loop.run_dir = (d / "run").string();
  o.d_model = 16, o.heads = 2, o.d_ff = 32, o.layers = 1;
  o.ngram_buckets = 256, o.ngram_max = 3,
  o.dropout = 0.1;  // n-gram inputs through train, save, load, predict
  // Trained to a criterion (every validation text right), not a step count: the step at which a
  // run gets there depends on the build's and the CPU's summation order. 20 steps got there in
  // Release on an AMD EPYC (bytes alone) and on an Intel Xeon (with these n-grams); the cap is
  // 1500.
  o.batch_rows = 16, o.loop.steps = 1500, o.loop.valid_every = 20, o.loop.warmup = 20,
  o.loop.lr_factor = 2.0;
  o.loop.stop_at = 1.0;  // macro-F1
  o.positions = "alibi";
  o.loop.quiet = true;
  classify::TrainResult r = classify::train(o);
  BOOST_TEST_MESSAGE("valid accuracy " << r.valid.accuracy << " after " << r.loop.last_step
                                       << " steps");
  BOOST_TEST_REQUIRE(r.loop.reached_target, "valid macro-F1 " << r.valid.macro_f1 << " after "
                                                              << r.loop.last_step << " steps");
  BOOST_TEST(r.valid.accuracy == 1.0);
  BOOST_TEST(r.valid.macro_f1 == 1.0);
  BOOST_TEST(r.valid.confusion[0][0] + r.valid.confusion[1][1] == 80);
  classify::LoadedRun run = classify::load_run(o.loop.run_dir);
  BOOST_TEST(run.labels == (std::vector<std::string>{"consonant", "vowel"}));
  // predict scores each text alone; evaluate batched it with longer ones (padding), and got every
  // one right: predict must too.
  std::vector<std::string> texts;
  for (const auto& e : valid) texts.push_back(e.text);
  texts.insert(texts.end(), {"", "  "});
  auto p = classify::predict(*run.model, run.labels, texts);
  for (size_t i = 0; i < valid.size(); ++i)
    BOOST_TEST(p[i].first == valid[i].label, "'" << valid[i].text << "'");
  BOOST_TEST(p[valid.size()].first.empty());  // an empty line gets no invented label
  BOOST_TEST(p[valid.size() + 1].first.empty());
  BOOST_TEST(p[0].second > 0.5);
  BOOST_CHECK_EXCEPTION(
      classify::evaluate(*run.model, run.labels, {{"klingon", "tkp"}}), Error,
      [](const Error& e) { return names(e, "label 'klingon' is not one of the model's labels"); });
}

// The metrics of a confusion matrix, by hand: 7 of 8 right; F1 6/7 and 8/9.
// A run whose weights load (checksum and all) but compute NaN: predict and evaluate fail naming
// the text or examples, the parameter holding NaN and the first op it reached (anomaly mode),
// where they once printed "nan" scores and an accuracy of argmax over NaN.
BOOST_AUTO_TEST_CASE(a_nan_weight_fails_predict_and_evaluate_by_name) {
  const TempDir dir("classify_nan");
  const fs::path d = dir.path;
  const std::vector<classify::Example> data = {
      {"vowel", "aeio"}, {"consonant", "tkpr"}, {"vowel", "ioea"}, {"consonant", "rpkt"}};
  classify::write_tsv((d / "train.tsv").string(), data);
  classify::write_tsv((d / "valid.tsv").string(), data);
  classify::TrainOptions o;
  o.data_dir = d.string(), o.loop.run_dir = (d / "run").string();
  o.d_model = 8, o.heads = 2, o.d_ff = 16, o.layers = 1, o.ngram_buckets = 0;
  o.loop.steps = 2, o.loop.valid_every = 2, o.loop.quiet = true;
  classify::train(o);
  const std::string weights = o.loop.run_dir + "/model.safetensors";
  BOOST_TEST(classify::predict(classify::load_run(o.loop.run_dir), {"aeio"}).size() == 1u);
  testing::put_nan_weight(weights, "head.weight");
  const classify::LoadedRun run = classify::load_run(o.loop.run_dir);  // the checksum holds
  BOOST_CHECK_EXCEPTION(classify::predict(run, {"", "aeio"}), Error, [](const Error& e) {
    return names(e,
                 "predict: the output for 'aeio' holds NaN: the model's parameter 'head.weight' "
                 "(f32 (2, 8)) holds NaN; anomaly: input ") &&
           names(e, " in head holds NaN");
  });
  BOOST_CHECK_EXCEPTION(classify::evaluate(run, data), Error, [](const Error& e) {
    return names(e,
                 "evaluate: the output for examples 1..4 holds NaN: the model's parameter "
                 "'head.weight'") &&
           names(e, "anomaly: input ");
  });
  BOOST_TEST(autograd::tape_size() == 0u);  // the anomaly reruns' entries freed
}

BOOST_AUTO_TEST_CASE(metrics_of_a_confusion_matrix) {
  const classify::Metrics m = classify::metrics_of({{3, 1}, {0, 4}});
  BOOST_TEST(m.n == 8);
  BOOST_TEST(m.accuracy == 7.0 / 8.0);
  BOOST_TEST(std::fabs(m.macro_f1 - (6.0 / 7.0 + 8.0 / 9.0) / 2) < 1e-15);
  BOOST_CHECK_EXCEPTION(classify::metrics_of({{0, 0}, {0, 0}}), Error,
                        [](const Error& e) { return names(e, "no examples to evaluate"); });
}

// The Naive Bayes baseline: the smoothed probabilities by hand on a two-text corpus, a small
// task learned, and its errors.
BOOST_AUTO_TEST_CASE(naive_bayes_baseline) {
  const std::vector<std::string> labels{"x", "y"};
  // x saw "ab" (grams a, b, ab), y saw "b" (gram b); V = 3, alpha 1:
  // P(a|x) = 2/6, P(a|y) = 1/4; P(b|x) = 2/6, P(b|y) = 2/4; equal priors.
  const classify::NaiveBayes nb({{"x", "ab"}, {"y", "b"}}, labels);
  BOOST_TEST(nb.predict("a") == 0);    // 1/3 > 1/4
  BOOST_TEST(nb.predict("b") == 1);    // 1/2 > 1/3
  BOOST_TEST(nb.predict("aab") == 0);  // seen grams a, a, ab, b (aa, aab unseen): x 1/81 > y 1/128
  BOOST_TEST(nb.predict("zzz") == 0);  // nothing seen: the priors tie, the first label
  // Two "languages" of different letters: every held-out word right.
  Generator g(5);
  auto word = [&](const char* letters) {
    std::string w;
    for (int i = 0, n = 3 + (int)g.below(9); i < n; ++i) w.push_back(letters[g.below(4)]);
    return w;
  };
  std::vector<classify::Example> train, valid;
  for (int i = 0; i < 200; ++i) {
    (i % 5 ? train : valid).push_back({"vowel", word("aeio")});
    (i % 5 ? train : valid).push_back({"consonant", word("tkpr")});
  }
  const std::vector<std::string> vc{"consonant", "vowel"};
  const classify::Metrics m = classify::evaluate(classify::NaiveBayes(train, vc), vc, valid);
  BOOST_TEST(m.accuracy == 1.0);
  BOOST_TEST(m.n == 80);
  BOOST_CHECK_EXCEPTION(classify::NaiveBayes({{"z", "a"}}, labels), Error, [](const Error& e) {
    return names(e, "label 'z' is not one of the model's labels");
  });
  BOOST_CHECK_EXCEPTION(classify::NaiveBayes({}, labels), Error, [](const Error& e) {
    return names(e, "naive bayes: no training examples");
  });
  BOOST_CHECK_EXCEPTION(classify::NaiveBayes({{"x", "a"}}, labels, 0.0), Error, [](const Error& e) {
    return names(e, "alpha must be a finite number > 0");
  });
}

// The program's --resume continues bit-exactly, with the schedule the run was started with (the
// resumed call leaves --lr-factor at its default).
BOOST_AUTO_TEST_CASE(resume_is_bit_exact) {
  const TempDir dir("classify_resume");
  const fs::path d = dir.path;
  std::vector<classify::Example> ex;
  for (int i = 0; i < 60; ++i)
    ex.push_back({i % 2 ? "odd" : "even", std::string(3 + i % 7, i % 2 ? 'x' : 'y')});
  classify::write_tsv((d / "train.tsv").string(), ex);
  classify::write_tsv((d / "valid.tsv").string(), ex);
  auto run = [&](const std::string& name, int64_t steps, bool resume) {
    classify::TrainOptions o;
    if (!resume) o.loop.lr_factor = 0.7;
    o.data_dir = d.string();
    o.loop.run_dir = (d / name).string();
    o.d_model = 8, o.heads = 2, o.d_ff = 8, o.layers = 1, o.batch_rows = 8, o.ngram_buckets = 64;
    o.loop.steps = steps, o.loop.valid_every = 10, o.loop.resume = resume, o.loop.quiet = true;
    return classify::train(o);
  };
  const classify::TrainResult whole = run("whole", 30, false);
  run("split", 15, false);
  // The schedule is written once, in the recipe; the top level holds none of it.
  const fs::path cfg = d / "split" / "config.json";
  const nlohmann::json train = train::load_json(cfg.string())["train"];
  BOOST_TEST(train["recipe"]["schedule"]["factor"] == 0.7);
  for (const char* key : {"lr", "lr_factor", "warmup"}) BOOST_TEST(!train.contains(key), key);
  const classify::TrainResult rest = run("split", 30, true);
  BOOST_TEST(rest.loop.losses ==
             std::vector<double>(whole.loop.losses.begin() + 15, whole.loop.losses.end()));
}

// On --resume the recipe is the one place the schedule is read from: top-level values beside it
// (as graft < 0.7 wrote them) are not read; without a recipe they are.
BOOST_AUTO_TEST_CASE(resume_reads_the_schedule_from_the_recipe) {
  train::LoopOptions saved;
  saved.steps = 100, saved.lr_factor = 0.5, saved.warmup = 12;
  const nlohmann::json recipe = train::loop_recipe(saved);
  train::LoopOptions loop;
  tasks::apply_saved_recipe({{"recipe", recipe}, {"lr_factor", 9.0}, {"warmup", 99}}, loop, "c");
  BOOST_TEST(loop.lr_factor == 0.5);
  BOOST_TEST(loop.warmup == 12);
  train::LoopOptions old;
  old.steps = 100, old.optimizer = "adamw", old.schedule = "cosine";  // not the run's
  old.lr = 3e-4;  // an --lr on resume: the old run trained with Noam (lr 0)
  tasks::apply_saved_recipe({{"lr_factor", 0.5}, {"warmup", 12}}, old, "c");
  BOOST_TEST(train::loop_recipe(old) == recipe);
  BOOST_CHECK_EXCEPTION(tasks::apply_saved_recipe({{"warmup", 12}}, old, "run/config.json"), Error,
                        [](const Error& e) { return names(e, "run/config.json"); });
}

// model.safetensors holds the weights of the newest validation with the highest macro-F1 (a tie
// takes the newer), not the latest: here validation's labels are the training labels swapped, so
// training makes it worse.
BOOST_AUTO_TEST_CASE(the_saved_weights_are_the_best_validated) {
  const TempDir dir("classify_best");
  const fs::path d = dir.path;
  std::vector<classify::Example> train, valid;
  for (int i = 0; i < 60; ++i) {
    const std::string text(3 + i % 7, i % 2 ? 'x' : 'y');
    train.push_back({i % 2 ? "odd" : "even", text});
    valid.push_back({i % 2 ? "even" : "odd", text});
  }
  classify::write_tsv((d / "train.tsv").string(), train);
  classify::write_tsv((d / "valid.tsv").string(), valid);
  classify::TrainOptions o;
  o.data_dir = d.string();
  o.loop.run_dir = (d / "run").string();
  o.d_model = 8, o.heads = 2, o.d_ff = 8, o.layers = 1, o.batch_rows = 8, o.ngram_buckets = 64;
  o.loop.steps = 60, o.loop.valid_every = 10, o.loop.quiet = true;
  const classify::TrainResult r = classify::train(o);
  std::ifstream csv(d / "run" / "metrics.csv");
  std::string line;
  std::getline(csv, line);
  BOOST_TEST(line == "step,train_loss,lr,tokens_per_s,valid_accuracy,valid_macro_f1");
  int64_t best_step = -1;
  double best = -1;
  while (std::getline(csv, line)) {
    const size_t last = line.rfind(',');
    if (last + 1 == line.size()) continue;  // no validation on this row
    if (const double f1 = std::stod(line.substr(last + 1)); f1 >= best)
      best = f1, best_step = std::stoll(line);
  }
  BOOST_TEST_REQUIRE(best_step < 60);  // else the test could not tell the best from the latest
  const train::SafetensorsFile saved =
      train::load_safetensors((d / "run" / "model.safetensors").string());
  BOOST_TEST(saved.metadata.at("step") == std::to_string(best_step));
  BOOST_TEST(std::fabs(r.valid.macro_f1 - best) < 1e-6);  // train() reports the saved weights
}

namespace {

// A fortunes directory with the topic files: `per_topic` fortunes each (two lines, one with a
// tab and a backspace), plus one fortune that art and food share.
void write_topic_files(const fs::path& dir, int per_topic) {
  fs::create_directories(dir);
  for (const std::string& topic : classify::kTopics) {
    std::ofstream f(dir / (topic + ".u8"));
    for (int i = 0; i < per_topic; ++i) f << topic << " fortune " << i << "\n\tsecond\b line\n%\n";
    if (topic == "art" || topic == "food") f << "shared by two files\n%\n";
  }
}

}  // namespace

// The topic task: one example per fortune (lines joined, control characters dropped), labels
// the file names, 80/10/10 by fortune, seeded and deterministic, no text in two splits.
BOOST_AUTO_TEST_CASE(topics_split) {
  const TempDir dir("classify_topics");
  write_topic_files(dir.path, 50);
  const classify::Splits a = classify::build_topics(dir.path.string(), 1);
  const classify::Splits b = classify::build_topics(dir.path.string(), 1);
  const classify::Splits c = classify::build_topics(dir.path.string(), 2);
  auto texts = [](const std::vector<classify::Example>& v) {
    std::vector<std::string> t;
    for (auto& e : v) t.push_back(e.label + "\t" + e.text);
    return t;
  };
  BOOST_TEST(texts(a.train) == texts(b.train));
  BOOST_TEST(texts(a.test) == texts(b.test));
  BOOST_TEST(texts(a.test) != texts(c.test));
  BOOST_TEST(a.train.size() + a.valid.size() + a.test.size() == 501u);  // the shared fortune once
  BOOST_TEST(a.test.size() == 51u);  // art's 51 fortunes put 6 in test (the 1st, 11th, ..., 51st)
  BOOST_TEST(a.valid.size() == 50u);
  BOOST_TEST(classify::labels_of(a.train, "train") == classify::kTopics);
  BOOST_TEST(classify::labels_of(a.test, "test") == classify::kTopics);
  std::set<std::string> seen;
  size_t n = 0;
  for (auto* split : {&a.train, &a.valid, &a.test})
    for (auto& e : *split) {
      seen.insert(e.text), ++n;
      BOOST_TEST((e.text == "shared by two files" || e.text.find(e.label + " fortune ") == 0));
      if (e.text != "shared by two files")
        BOOST_TEST(e.text.substr(e.text.find(" second")) == " second line");
    }
  BOOST_TEST(seen.size() == n);  // no fortune twice, so none in two splits
  BOOST_CHECK_EXCEPTION(classify::build_topics((dir.path / "none").string(), 1), Error,
                        [](const Error& e) { return names(e, "none/art.u8' is missing"); });
}

namespace {

// A pretrained directory as save_hf_bert writes it, with a vocab.txt: a tiny random BERT.
const std::vector<std::string> kToyVocab{"[PAD]",  "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat",
                                         "dog",    "bird",  "fish",  "red",   "blue",   "green",
                                         "yellow", "the",   "a",     "##s"};

void write_tiny_pretrained(const fs::path& dir) {
  models::BertConfig c;
  c.vocab = (int64_t)kToyVocab.size(), c.d_model = 16, c.heads = 2, c.d_ff = 32, c.layers = 1,
  c.max_len = 24;
  c.dropout = 0.0, c.attention_dropout = 0.0;
  models::BertEncoder m(c);
  models::save_hf_bert(m, dir.string());
  std::ofstream v(dir / "vocab.txt");
  for (auto& t : kToyVocab) v << t << "\n";
}

// Two topics told apart by their words (animals or colours), with shared filler words.
std::vector<classify::Example> toy_topics(int n, uint64_t seed) {
  Generator g(seed);
  const char* animals[] = {"cat", "dog", "bird", "fish"};
  const char* colours[] = {"red", "blue", "green", "yellow"};
  std::vector<classify::Example> out;
  for (int i = 0; i < n; ++i) {
    const bool animal = i % 2 == 0;
    std::string t = g.below(2) ? "the" : "a";
    for (int k = 0, len = 1 + (int)g.below(4); k < len; ++k)
      t += std::string(" ") + (animal ? animals : colours)[g.below(4)] +
           (g.below(3) == 0 ? "s" : "");
    out.push_back({animal ? "animal" : "colour", t});
  }
  return out;
}

classify::TrainOptions tiny_options(const fs::path& d, const std::string& run, bool freeze) {
  classify::TrainOptions o;
  o.data_dir = d.string(), o.loop.run_dir = (d / run).string(), o.init_from = (d / "bert").string();
  o.freeze = freeze, o.batch_rows = 8, o.dropout = 0.1, o.plot = false;
  o.loop.optimizer = "adamw", o.loop.schedule = "constant", o.loop.lr = 3e-3, o.loop.warmup = 10;
  o.loop.valid_every = 10, o.loop.log_every = 10, o.loop.quiet = true;
  return o;
}

}  // namespace

// classify train --init-from: a tiny random BERT and a hand-made vocab.txt learn a separable
// toy task to a criterion (every training text right; caps 300 and 1500 steps), fine-tuned and
// frozen; the run directory alone (the pretrained directory removed) evaluates and predicts.
BOOST_AUTO_TEST_CASE(init_from_a_pretrained_encoder) {
  const TempDir dir("classify_pretrained");
  const fs::path d = dir.path;
  write_tiny_pretrained(d / "bert");
  const std::vector<classify::Example> train = toy_topics(64, 3);
  classify::write_tsv((d / "train.tsv").string(), train);
  classify::write_tsv((d / "valid.tsv").string(), train);  // validation = training accuracy
  for (const bool freeze : {false, true}) {
    classify::TrainOptions o = tiny_options(d, freeze ? "frozen" : "tuned", freeze);
    o.loop.steps = freeze ? 1500 : 300,
    o.loop.stop_at = 1.0;  // reached after 10 and 190 steps here
    if (freeze)
      o.loop.lr = 1e-1, o.dropout = 0;  // the head alone: logistic regression on fixed features
    const classify::TrainResult r = classify::train(o);
    BOOST_TEST_MESSAGE((freeze ? "frozen" : "fine-tuned")
                       << ": macro-F1 1 after " << r.loop.target_step << " steps");
    BOOST_TEST_REQUIRE(r.loop.reached_target, (freeze ? "frozen" : "fine-tuned")
                                                  << ": train macro-F1 " << r.valid.macro_f1
                                                  << " after 300 steps");
    BOOST_TEST(r.valid.accuracy == 1.0);
  }
  fs::remove_all(d / "bert");
  for (const char* run : {"tuned", "frozen"}) {
    BOOST_TEST(fs::is_regular_file(d / run / "tokenizer" / "vocab.txt"));
    const classify::LoadedRun loaded = classify::load_run((d / run).string());
    BOOST_TEST_REQUIRE(loaded.pretrained != nullptr);
    BOOST_TEST(loaded.labels == (std::vector<std::string>{"animal", "colour"}));
    BOOST_TEST(classify::evaluate(loaded, train).accuracy == 1.0);
    const auto p = classify::predict(loaded, {"the dogs", "a green", " "});
    BOOST_TEST(p[0].first == "animal");
    BOOST_TEST(p[1].first == "colour");
    BOOST_TEST(p[2].first.empty());
  }
  // A tokenizer edited after training is refused (its checksum is tied to the weights).
  std::ofstream(d / "tuned" / "tokenizer" / "vocab.txt", std::ios::app) << "extra\n";
  BOOST_CHECK_EXCEPTION(classify::load_run((d / "tuned").string()), Error,
                        [](const Error& e) { return names(e, "vocab.txt"); });
}

// --resume of a fine-tuning run continues bit-exactly.
// The pretrained family's predict and evaluate check their outputs too: a head weight of NaN
// (the file's checksum restored, so it loads) is named, never printed as a score.
BOOST_AUTO_TEST_CASE(init_from_a_nan_weight_fails_predict_and_evaluate_by_name) {
  const TempDir dir("classify_pretrained_nan");
  const fs::path d = dir.path;
  write_tiny_pretrained(d / "bert");
  const std::vector<classify::Example> train = toy_topics(16, 3);
  classify::write_tsv((d / "train.tsv").string(), train);
  classify::write_tsv((d / "valid.tsv").string(), train);
  classify::TrainOptions o = tiny_options(d, "tuned", false);
  o.loop.steps = 2, o.loop.valid_every = 2;
  classify::train(o);
  const std::string weights = o.loop.run_dir + "/model.safetensors";
  std::string head;
  for (const auto& [name, t] : train::load_safetensors(weights).tensors)
    if (name.find("head") != std::string::npos && t.dim() == 2) head = name;
  BOOST_TEST_REQUIRE(!head.empty());
  testing::put_nan_weight(weights, head);
  const classify::LoadedRun run = classify::load_run(o.loop.run_dir);
  BOOST_CHECK_EXCEPTION(classify::predict(run, {"the dogs"}), Error, [&](const Error& e) {
    return names(e, "predict: the output for 'the dogs' holds NaN: the model's parameter '" + head +
                        "'") &&
           names(e, "anomaly: input ");
  });
  BOOST_CHECK_EXCEPTION(classify::evaluate(run, train), Error, [&](const Error& e) {
    return names(
        e, "evaluate: the output for a batch holds NaN: the model's parameter '" + head + "'");
  });
}

BOOST_AUTO_TEST_CASE(init_from_resume_is_bit_exact) {
  const TempDir dir("classify_pretrained_resume");
  const fs::path d = dir.path;
  write_tiny_pretrained(d / "bert");
  const std::vector<classify::Example> train = toy_topics(32, 5);
  classify::write_tsv((d / "train.tsv").string(), train);
  classify::write_tsv((d / "valid.tsv").string(), train);
  auto run = [&](const std::string& name, int64_t steps, bool resume) {
    classify::TrainOptions o = tiny_options(d, name, false);
    if (resume) o.init_from.clear(), o.batch_rows = 512;  // both come from the run's config.json
    o.loop.steps = steps, o.loop.resume = resume;
    return classify::train(o);
  };
  const classify::TrainResult whole = run("whole", 20, false);
  run("split", 10, false);
  const classify::TrainResult rest = run("split", 20, true);
  BOOST_TEST(rest.loop.losses ==
             std::vector<double>(whole.loop.losses.begin() + 10, whole.loop.losses.end()));
}

// --init-from a directory that is not a pretrained model: an error naming it, before any work.
BOOST_AUTO_TEST_CASE(init_from_bad_directory) {
  const TempDir dir("classify_pretrained_bad");
  const fs::path d = dir.path;
  classify::write_tsv((d / "train.tsv").string(), toy_topics(8, 1));
  classify::write_tsv((d / "valid.tsv").string(), toy_topics(8, 2));
  fs::create_directories(d / "empty");
  classify::TrainOptions o = tiny_options(d, "run", false);
  o.init_from = (d / "empty").string(), o.loop.steps = 5;
  BOOST_CHECK_EXCEPTION(classify::train(o), Error, [&](const Error& e) {
    return names(e, "--init-from '" + (d / "empty").string() + "' has no config.json");
  });
  o.init_from.clear(), o.freeze = true;
  BOOST_CHECK_EXCEPTION(classify::train(o), Error,
                        [](const Error& e) { return names(e, "--freeze needs --init-from"); });
}

BOOST_AUTO_TEST_SUITE_END()
