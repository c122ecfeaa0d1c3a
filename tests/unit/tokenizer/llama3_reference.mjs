// Llama 3 tokenizer reference for hf_tokenizer_test, built on the npm package
// llama3-tokenizer-js (MIT), which ships Llama 3's vocabulary, merges and an
// encoder of its own.
//
//   node llama3_reference.mjs tokenizer <node_modules> <out_dir>
//     writes <out_dir>/tokenizer.json (the tokenizers-library format, as Meta
//     publishes it) and tokenizer_config.json from the package's data.
//   node llama3_reference.mjs encode <node_modules> <corpus.json> <out.json> [special]
//     encodes each string of the JSON array with the package's encoder (no
//     BOS/EOS) and writes the JSON array of id arrays; special tokens are
//     recognised only when "special" is given.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [mode, modules, ...rest] = process.argv.slice(2);
const bundle = path.join(modules, 'llama3-tokenizer-js', 'bundle',
                         'llama3-tokenizer-with-baked-data.js');
const tokenizer = (await import(pathToFileURL(bundle).href)).default;

// Llama 3's pre-tokenizer pattern, exactly as in Meta's tokenizer.json.
const kPattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|" +
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const kFirstSpecial = 128000;

function writeTokenizer(outDir) {
  const vocabById = tokenizer.vocabById;
  if (vocabById.length !== 128256) throw new Error(`expected 128256 tokens, got ${vocabById.length}`);
  const vocab = {};
  for (let id = 0; id < kFirstSpecial; ++id) vocab[vocabById[id]] = id;
  // The package keys merges by "left right" in rank order.
  const merges = [...tokenizer.merges.keys()];
  const added = [];
  for (let id = kFirstSpecial; id < vocabById.length; ++id) {
    added.push({ id, content: vocabById[id], single_word: false, lstrip: false, rstrip: false,
                 normalized: false, special: true });
  }
  const bos = '<|begin_of_text|>';
  const json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: kPattern }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                 { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
          special_tokens: { [bos]: { id: bos, ids: [kFirstSpecial], tokens: [bos] } },
        },
      ],
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
      vocab, merges,
    },
  };
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, 'tokenizer.json'), JSON.stringify(json));
  const config = { bos_token: bos, eos_token: '<|end_of_text|>', model_max_length: 131072,
                   tokenizer_class: 'PreTrainedTokenizerFast' };
  fs.writeFileSync(path.join(outDir, 'tokenizer_config.json'), JSON.stringify(config, null, 2));
}

function encodeCorpus(corpusPath, outPath, special) {
  const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
  const options = { bos: false, eos: false };
  // A pattern that never matches: special-token spellings stay plain text.
  if (!special) options.specialTokenRegex = /(?!)/g;
  const ids = corpus.map((text) => tokenizer.encode(text, options));
  fs.writeFileSync(outPath, JSON.stringify(ids));
}

if (mode === 'tokenizer') {
  writeTokenizer(rest[0]);
} else if (mode === 'encode') {
  encodeCorpus(rest[0], rest[1], rest[2] === 'special');
} else {
  console.error('usage: llama3_reference.mjs tokenizer|encode <node_modules> ...');
  process.exit(2);
}
