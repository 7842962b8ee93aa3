// The text each token adds where it follows other text: what JSON mode checks a token against. A lone token's
// decode can differ -- decoders that strip the text's first space (SentencePiece's Strip, Metaspace) drop a "▁"
// token's space -- so each token is decoded after an anchor token and the anchor's own text taken off.
#pragma once
#include <string>
#include <vector>

#include "exl3/tokenizer.h"

namespace exl3 {

// [vocab] texts; "" for special tokens and for ids past the tokenizer's vocabulary.
std::vector<std::string> token_texts(const Tokenizer& tok, int vocab);

}  // namespace exl3
