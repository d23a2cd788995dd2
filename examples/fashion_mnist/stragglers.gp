# Accuracy against modelled time for the straggler study, one panel per delay model.
# Called as: gnuplot -e "dir='DIR'; png='OUT.png'; n=10; r=2; target=0.75" stragglers.gp
# DIR holds the study's CSV files, named n<N>-r<R>-<delays>.csv (fashion_mnist_stragglers --csv).
if (!exists("dir")) dir = "."
if (!exists("png")) png = "stragglers.png"
if (!exists("n")) n = 10
if (!exists("r")) r = 2
if (!exists("target")) target = 0.75
set datafile separator ","
set terminal pngcairo size 1400,900 noenhanced font ",10"
set output png
set multiplot layout 2,2 title sprintf("Fashion-MNIST, n = %d, r = %d: test accuracy vs modelled time", n, r)
set xlabel "modelled time (s)"
set ylabel "test accuracy"
set yrange [0.5:0.86]
set grid
set key bottom right
set logscale x
delays = "none slow exp pareto"
names = "no stragglers|one node 5x slower|shifted exponential, mean T|Pareto tail 1.5, mean T"
do for [i = 1:4] {
  d = word(delays, i)
  f = sprintf("%s/n%d-r%d-%s.csv", dir, n, r, d)
  set title sprintf("%s", system(sprintf("echo '%s' | cut -d'|' -f%d", names, i)))
  set arrow 1 from graph 0, first target to graph 1, first target nohead dt 2 lc rgb "gray"
  schemes = system("test -f '".f."' && tail -n +2 '".f."' | cut -d, -f1 | uniq | tr '\\n' ' '")
  plot for [s in schemes] f using (strcol(1) eq s ? $6 : NaN):7 with linespoints pt 7 ps 0.5 title s
}
unset multiplot
