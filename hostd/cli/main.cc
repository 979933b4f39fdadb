// hvtrace: the command-line front end of hvtraced. Every command and its
// flags are in command_table.cc and the files it names.
#include "command_table.h"

int main(int argc, char** argv) { return hvtrace::cli::CommandTable().Main(argc, argv); }
