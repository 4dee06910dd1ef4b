#include <graft/graft.h>

int main() { return graft::ones({2}).to_vector<float>().size() == 2 ? 0 : 1; }
